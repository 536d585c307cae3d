"""A test CA and certificates signed by it, made with the openssl command as docs/security.md
tells an operator to: EC P-256 keys (fast to make), SANs for the loopback names."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Issued:
    cert_file: str
    key_file: str


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


class TestCA:
    """A self-signed CA in ``directory``; ``issue`` signs a certificate for a name."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "tidemq test CA") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.key_file = str(directory / "ca.key")
        self.ca_file = str(directory / "ca.crt")
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", self.key_file)
        _openssl(
            "req", "-x509", "-new", "-key", self.key_file, "-sha256", "-days", "2",
            "-subj", f"/CN={name}", "-out", self.ca_file,
        )  # fmt: skip

    def issue(
        self,
        common_name: str,
        *,
        dns: tuple[str, ...] = ("localhost",),
        ips: tuple[str, ...] = ("127.0.0.1",),
        stem: str | None = None,
    ) -> Issued:
        """A certificate for ``common_name`` with these SANs, written as ``<stem>.crt/.key``."""
        stem = stem or common_name.replace(":", "_")
        key = self.directory / f"{stem}.key"
        csr = self.directory / f"{stem}.csr"
        crt = self.directory / f"{stem}.crt"
        ext = self.directory / f"{stem}.ext"
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        ext.write_text(
            "basicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            f"subjectAltName={','.join(sans)}\n"
        )
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
        _openssl("req", "-new", "-key", key, "-subj", f"/CN={common_name}", "-out", csr)
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.ca_file, "-CAkey", self.key_file,
            "-CAcreateserial", "-days", "2", "-sha256", "-extfile", ext, "-out", crt,
        )  # fmt: skip
        return Issued(str(crt), str(key))
