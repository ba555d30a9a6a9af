"""tests/gpu/upstream_compare.py: two junit reports of upstream's test_cuda.py, stock against
+um, compared test by test into the record tests/gpu/results/ keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu import upstream_compare as cmp

STOCK = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="test_cuda.TestCuda" name="test_a" time="0.1"/>
<testcase classname="test_cuda.TestCuda" name="test_graph" time="0.1"/>
<testcase classname="test_cuda.TestCuda" name="test_gone" time="0.1"/>
<testcase classname="test_cuda.TestCuda" name="test_skip"><skipped message="no"/></testcase>
<testcase classname="test_cuda.TestCuda" name="test_broken"><failure message="x"/></testcase>
</testsuite></testsuites>
"""
UM = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="test_cuda.TestCuda" name="test_a" time="0.1"/>
<testcase classname="test_cuda.TestCuda" name="test_graph"><failure message="rose"/></testcase>
<testcase classname="test_cuda.TestCuda" name="test_skip"><skipped message="no"/></testcase>
<testcase classname="test_cuda.TestCuda" name="test_broken" time="0.1"/>
<testcase classname="test_cuda.TestCuda" name="test_broken"><error message="teardown"/></testcase>
</testsuite></testsuites>
"""


def _write(tmp_path: Path, stock: str, um: str) -> tuple[Path, Path]:
    (tmp_path / "s.xml").write_text(stock)
    (tmp_path / "u.xml").write_text(um)
    return tmp_path / "s.xml", tmp_path / "u.xml"


def test_a_test_passed_on_stock_and_failed_or_missing_on_um_is_a_regression(tmp_path: Path) -> None:
    s, u = _write(tmp_path, STOCK, UM)
    out = tmp_path / "record.md"
    rc = cmp.main(["--stock", str(s), "--um", str(u), "--out", str(out), "--source", "at abc",
                   "--note", "driver: 580"])
    assert rc == 1
    text = out.read_text()
    assert "2 test(s) passed on stock and not on +um" in text
    assert "- `test_cuda.TestCuda::test_graph`: failed" in text
    assert "- `test_cuda.TestCuda::test_gone`: missing" in text
    # failed on stock, erred on +um (the worse of its two reports): a difference, not a regression
    assert "| `test_cuda.TestCuda::test_broken` | failed | error |" in text
    assert "Upstream test file: at abc" in text and "- driver: 580" in text
    assert "| stock | 3 | 1 | 0 | 1 | 5 |" in text and "| +um | 1 | 1 | 1 | 1 | 4 |" in text


def test_no_regression_exits_zero(tmp_path: Path) -> None:
    s, u = _write(tmp_path, STOCK, STOCK)
    out = tmp_path / "record.md"
    assert cmp.main(["--stock", str(s), "--um", str(u), "--out", str(out)]) == 0
    assert "Every test that passed on stock passed on +um." in out.read_text()


def test_an_unreadable_report_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s, _ = _write(tmp_path, STOCK, "<testsuites>")
    rc = cmp.main(["--stock", str(s), "--um", str(tmp_path / "u.xml"), "--out", str(tmp_path / "r")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read the junit report") and "u.xml" in err


def test_a_run_where_nothing_passed_on_stock_compares_nothing(tmp_path: Path) -> None:
    erred = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="1">
<testcase classname="" name="test_cuda"><error message="collection failed"/></testcase>
</testsuite></testsuites>
"""
    s, u = _write(tmp_path, erred, erred)
    out = tmp_path / "record.md"
    assert cmp.main(["--stock", str(s), "--um", str(u), "--out", str(out)]) == 2
    text = out.read_text()
    assert "Nothing to compare: no test passed on stock" in text
    assert "Every test that passed on stock passed on +um" not in text
