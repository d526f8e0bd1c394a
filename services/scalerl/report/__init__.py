"""Reports of a run folder: the fitted curve, forecasts and training diagnostics as PNG + one HTML file.

`write_report(run_dir)` writes `curve.png` and a self-contained `report.html`; `fit_run_metrics(records)`
is the cheap online refit the training loop calls after every eval. Matplotlib is imported only when a
plot is drawn.
"""

from scalerl.report.online import fit_run_metrics
from scalerl.report.page import write_report

__all__ = ["fit_run_metrics", "write_report"]
