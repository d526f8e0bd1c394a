"""Unit tests check a command's other settings; the gRPC ports' protection is chosen here once, as plain
text (tests/unit/rpc/test_rpc_security_settings.py checks what happens when it is not chosen or is
malformed, and the integration tests run the roles under mutual TLS)."""

from __future__ import annotations

import pytest

from scalerl.rpc.security import ENV_PLAINTEXT, ENV_TLS_DIR


@pytest.fixture(autouse=True)
def _plain_text_rpc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TLS_DIR, raising=False)
    monkeypatch.setenv(ENV_PLAINTEXT, "true")
