"""service.provenance's report statement names the detector's identity hashed once per
distinct settings: the same identity ledger.reports computes, for settings that differ
only where JSON does (1, 1.0 and true; 0.0 and -0.0) as well."""

from __future__ import annotations

from detector.detect import DetectorConfig
from ledger.reports import detector_identity
from service.provenance import DETECTOR_VERSION, _detector_identity, report_settings, report_statement


def test_the_memoised_identity_is_the_ledgers_for_every_settings():
    base = report_settings(DetectorConfig(), normalize=True)
    variants = [base, report_settings(DetectorConfig(), normalize=None),
                report_settings(DetectorConfig(threshold=1e-3, spans=False), normalize=False),
                {**base, "threshold": 1}, {**base, "threshold": 1.0}, {**base, "threshold": True},
                {**base, "threshold": 0.0}, {**base, "threshold": -0.0},
                {**base, "ledger": {**base["ledger"], "matches_tested": 4}}]
    digests = set()
    for _ in range(2):  # computed, then from the memo
        for settings in variants:
            assert _detector_identity(settings) == detector_identity(DETECTOR_VERSION, settings)
            digests.add(_detector_identity(settings)["config_sha256"])
    assert len(digests) == len(variants)


def test_a_statement_cannot_change_the_memoised_identity():
    settings = report_settings(DetectorConfig(), normalize=True)
    first = report_statement({"watermarked": True}, text="a text", token_ids=[1, 2], scope={"keys": 1},
                             settings=settings)
    first["detector"]["config_sha256"] = "changed"
    again = report_statement({"watermarked": True}, text="a text", token_ids=[1, 2], scope={"keys": 1},
                             settings=settings)
    assert again["detector"] == detector_identity(DETECTOR_VERSION, settings)
