"""The seal's estimate before the rental ends (docs/record.md, Campaign time) comes from a rate measured on this machine, in this run:
the seal's own writer timed over the first MiBs of the package's largest files, and the estimate says so. A
package with nothing to read keeps the prior, and says that instead."""
from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from itera_verify.package import RunContext
from itera_verify.report import summary
from itera_verify.seal.rate import SAMPLE_BYTES, Measured, measure, measure_package
from tests import helpers

DEADLINE = "2030-01-01T00:00:00Z"


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "pkg"
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints/optimizer.pt").write_bytes(os.urandom(40 * 2**20))  # incompressible, as weights nearly are
    (root / "metrics.jsonl").write_text('{"step": 1, "name": "loss", "value": 2.5}\n' * 1000)
    return root


def measured_context(root, deadline: str = DEADLINE, **options) -> tuple[RunContext, Measured | None]:
    """What the workflow sets up before the report looks: the deadline, and the seal's rate measured here (at
    the seal's options), a result the rental's estimate is handed."""
    ctx = helpers.context(root, deadline=deadline, **options)
    return ctx, measure_package(ctx, level=ctx.options.level, threads=ctx.options.threads)


def test_the_seal_writer_is_timed_over_the_first_mibs_of_the_largest_files(package):
    largest = str(package / "checkpoints/optimizer.pt")
    measured = measure([(str(package / "metrics.jsonl"), 42_000), (largest, 40 * 2**20)], threads=1)
    assert measured.sample_bytes == SAMPLE_BYTES  # the first 32 MiB of the largest file, not the small one
    assert measured.seconds > 0 and measured.bytes_per_second == pytest.approx(SAMPLE_BYTES / measured.seconds)
    assert measured.level == 3 and measured.workers == 1
    assert measured.words().startswith("measured here: the seal's writer (SHA-256, zstd level 3, 1 thread) took ")
    assert measure([]) is None and measure([(str(package / "absent"), 10)]) is None


def test_the_rentals_estimate_uses_the_rate_measured_here_and_says_so(package):
    ctx, measured = measured_context(package)
    rental = summary.rental_summary(ctx, now=datetime(2029, 12, 31, tzinfo=UTC), measured=measured)
    assert measured is not None and measured.sample_bytes == SAMPLE_BYTES
    rates = rental["rates"]
    assert rates["seal_bytes_per_second"] == round(measured.bytes_per_second) != summary.SEAL_BYTES_PER_SECOND
    assert rates["seal_rate_source"] == measured.words() and rates["push_rate_source"] is None
    size = rental["package_bytes"]
    assert rental["seal_estimate_seconds"] == round(size / measured.bytes_per_second, 1)
    assert summary.rental_summary(ctx, now=datetime(2029, 12, 31, tzinfo=UTC), measured=measured) == rental


def test_a_deadline_the_measured_rate_cannot_meet_is_warned_with_that_rate(package):
    ctx, measured = measured_context(package)
    end = datetime.fromisoformat(DEADLINE)
    first = summary.rental_summary(ctx, now=end - timedelta(days=1), measured=measured)
    needed = first["package_bytes"] / measured.bytes_per_second
    assert "warning" not in first
    near = summary.rental_summary(ctx, now=end - timedelta(seconds=needed * 1.2), measured=measured)  # too near
    assert "may not finish in time" in near["warning"] and "(measured here: the seal's writer" in near["warning"]
    pushing, _ = measured_context(package, pushing=True)
    pushed = summary.rental_summary(pushing, now=end - timedelta(days=1), measured=measured)
    assert pushed["rates"]["push_rate_source"] == summary.PUSH_PRIOR_WORDS  # the push measures its own parts


def test_a_package_with_nothing_to_read_keeps_the_prior_and_says_so(tmp_path):
    (tmp_path / "pkg").mkdir()
    ctx, measured = measured_context(tmp_path / "pkg")
    assert measured is None
    rental = summary.rental_summary(ctx, now=datetime(2029, 12, 31, tzinfo=UTC), measured=measured)
    assert rental["rates"]["seal_bytes_per_second"] == summary.SEAL_BYTES_PER_SECOND
    assert rental["rates"]["seal_rate_source"].startswith("a prior")


def test_the_rate_is_measured_at_the_seals_own_level_and_threads(package):
    ctx, measured = measured_context(package, level=9, threads=1)
    rental = summary.rental_summary(ctx, now=datetime(2029, 12, 31, tzinfo=UTC), measured=measured)
    assert (measured.level, measured.workers) == (9, 1)
    assert "zstd level 9, 1 thread)" in rental["rates"]["seal_rate_source"]


def test_the_workflow_measures_the_rate_once_and_the_report_only_reads_it(package, monkeypatch):
    """verify() measures at its --level and --threads before the checks; the report's rental reads that."""
    from itera_verify.flows.config import Config, settle
    from itera_verify.flows.verify import verify
    from itera_verify.seal import rate

    calls = []
    real = rate.measure_package
    monkeypatch.setattr(rate, "measure_package", lambda ctx, **seal: calls.append(seal) or real(ctx, **seal))
    report = verify(package, settle(Config(), reload=False, seal=False, level=9, threads=1, deadline=DEADLINE))
    assert calls == [{"level": 9, "threads": 1}]
    assert "zstd level 9, 1 thread)" in report.plan["rental"]["rates"]["seal_rate_source"]
    ctx = helpers.context(package, deadline=DEADLINE)  # no rate handed: the estimate keeps the prior
    assert summary.rental_summary(ctx)["rates"]["seal_rate_source"].startswith("a prior")
