"""Reports of a run folder: the fitted curve, forecasts and training diagnostics as PNG + one HTML file.

`write_report(run_dir)` writes `curve.png` and a self-contained `report.html`; `fit_run_metrics(records)`
is the cheap online refit the training loop calls after every eval. Matplotlib is imported only when a
plot is drawn, and numpy/scipy only when one of these names is first read (`scalerl.lazy`), so reading a
run's files (`report.runfiles`) to check a command's arguments stays light.

`scalerl fit` and `scalerl compare` live here too (`report.commands`, `report.handlers`): they read files and
draw, so they sit above `scaling`'s pure math, which imports nothing of this package.
"""

from typing import TYPE_CHECKING

from scalerl.lazy import lazy_exports

if TYPE_CHECKING:
    from scalerl.report.online import fit_run_metrics
    from scalerl.report.page import write_report

__getattr__ = lazy_exports(__name__, {"fit_run_metrics": "online", "write_report": "page"})

__all__ = ["fit_run_metrics", "write_report"]
