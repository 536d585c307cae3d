"""The archive's metrics (docs/archive.md, docs/operations.md), read from the store at scrape
time: what was archived, what failed, what waits, and how reads past retention were served."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidemq.storage import MessageStore


class ArchiveCollector:
    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def _families(self) -> list[CounterMetricFamily | GaugeMetricFamily]:
        return [
            CounterMetricFamily(
                "tidemq_archive_files",
                "Sealed CommitLog files given a manifest entry: archived (uploaded and verified) "
                "or skipped (no topic in them has the archive policy)",
                labels=("outcome",),
            ),
            CounterMetricFamily(
                "tidemq_archive_bytes",
                "CommitLog bytes archived (uncompressed)",
            ),
            CounterMetricFamily(
                "tidemq_archive_stored_bytes",
                "Bytes sent to the archive (compressed chunks; chunks found already there are "
                "not sent again)",
            ),
            CounterMetricFamily(
                "tidemq_archive_chunks_reused",
                "Chunks an upload found already archived with the right checksum and did not send "
                "again (an upload resumed after a crash or a failed pass)",
            ),
            CounterMetricFamily(
                "tidemq_archive_failures",
                "Archiving passes that stopped on an error (unreachable archive, a file whose "
                "records do not check, an archived object that did not read back the same)",
            ),
            GaugeMetricFamily(
                "tidemq_archive_up",
                "1 when the last archiving pass reached the archive; 0 while it cannot (retention "
                "deletes nothing that is not archived meanwhile)",
            ),
            GaugeMetricFamily(
                "tidemq_archive_pending_files",
                "Sealed CommitLog files that have no manifest entry yet",
            ),
            CounterMetricFamily(
                "tidemq_archive_read_chunks",
                "Archived chunks read past local retention: fetched from the archive or found in "
                "the cache",
                labels=("source",),
            ),
            CounterMetricFamily(
                "tidemq_archive_corrupt_objects",
                "Archived objects refused on a read because they failed their checksum",
            ),
        ]

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        archiver = self.store.archiver
        if archiver is None:
            return []  # no archive configured: no archive metrics
        files, nbytes, stored, reused, failures, up, pending, chunks, corrupt = families
        c = archiver.counts
        files.add_metric(["archived"], c.files_archived)
        files.add_metric(["skipped"], c.files_skipped)
        nbytes.add_metric([], c.bytes_archived)
        stored.add_metric([], c.bytes_stored)
        reused.add_metric([], c.chunks_reused)
        failures.add_metric([], c.failures)
        up.add_metric([], 1 if archiver.reachable else 0)
        pending.add_metric([], c.pending_files)
        reads = archiver.reader.counts
        chunks.add_metric(["archive"], reads.chunk_fetches)
        chunks.add_metric(["cache"], reads.chunk_hits)
        corrupt.add_metric([], reads.corrupt)
        return families
