"""The metrics and audit-event references in docs/ match the code they are generated from."""

from __future__ import annotations

import pytest

from hotseat_common.messages.audit import PoolOutcome, RequestOutcome
from tests.docs import reference


def test_checked_in_references_are_current():
    """docs/metrics.md and docs/audit-events.md are exactly what the generator writes."""
    assert reference.stale_pages() == [], "run: .venv/bin/python -m tests.docs.reference"


def test_every_audit_outcome_has_a_meaning_and_no_meaning_is_stale():
    """A new outcome in the code cannot ship without its line in the reference."""
    outcomes = {o.value for o in RequestOutcome} | {o.value for o in PoolOutcome}
    assert set(reference.OUTCOMES) == outcomes


def test_metrics_reference_lists_every_exported_metric_with_labels():
    """Each metric of each service appears once, with its labels and the services that
    export it (the audit publisher's counters by both router and controller)."""
    table = reference.metrics_table()
    by_name = {m.name: m for m in reference.collect_metrics()}
    assert by_name["hotseat_pool_busy_skips_total"].labels == ("router", "pool", "member")
    assert by_name["hotseat_pool_busy_skips_total"].exporters == ("router",)
    assert by_name["hotseat_audit_events_dropped_total"].exporters == ("router", "controller")
    assert by_name["hotseat_pool_swap_duration_seconds"].kind == "histogram"
    for name in by_name:
        assert table.count(f"| `{name}` |") == 1


def test_a_changed_page_is_reported_stale(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """The check can fail: a page whose generated table lost a row is out of date."""
    page = tmp_path / "metrics.md"
    text = reference.METRICS_DOC.read_text(encoding="utf-8")
    page.write_text(text.replace("| `hotseat_pool_resident` |", "| `hotseat_pool_residents` |"))
    monkeypatch.setattr(reference, "PAGES", ((page, "metrics", reference.metrics_table),))
    assert reference.stale_pages() == [page]
