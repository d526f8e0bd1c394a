"""Telemetry of the roles: OpenTelemetry traces (`tracing`), Prometheus metrics (`metrics`) and the
FastAPI side port that serves /healthz, /readyz and /metrics (`sideport`)."""
