"""The compiled halves of the record codecs (everything else is in pyproject.toml).

Two small C extensions, each beside a pure-Python twin that gives the same bytes and the same
errors (aiokafka's model, ``aiokafka/record/_crecords``):

- ``tidemq.storage.record._cblock`` (``storage/record/_cblock.c``): the broker's per-record work
  on whole spans: filling a producer's block, dispatch's scan, a pull's gather, CRC-32.
- ``tidemq.protos._crecords`` (``protos/_crecords.c``): the client's: encoding a send's block,
  the send results derived from a block's answer, decoding pulled records.

Both are optional: where no C compiler exists the install still succeeds and the twins run
(``TIDEMQ_PURE_PYTHON=1`` forces the twins where the extensions are built). The tests import the
compiled modules directly, so a machine that should build them and did not fails ``make test``.
"""

from __future__ import annotations

from setuptools import Extension, setup

# -O3 for the per-record loops; C11 for the fixed-width types and static asserts.
_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fno-strict-aliasing"]


def _extension(name: str, source: str) -> Extension:
    return Extension(name, [source], extra_compile_args=_FLAGS, optional=True)


setup(
    ext_modules=[
        _extension("tidemq.storage.record._cblock", "storage/record/_cblock.c"),
        _extension("tidemq.protos._crecords", "protos/_crecords.c"),
    ]
)
