"""Fixtures every test directory may use."""

# s3_endpoint and s3_archive: a real S3 API (moto's server) on loopback, for the archive.
pytest_plugins = ["tests.s3_server"]
