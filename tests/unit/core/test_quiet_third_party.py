"""Third-party deprecation notices (transformers' FutureWarning printed into every progress bar) are kept
off the terminal, precisely: other warnings, ours included, still show."""

from __future__ import annotations

import logging
import warnings

from scalerl.console import quiet_third_party_bars

TRANSFORMERS_NOTICE = ("`past_key_values` is deprecated and will be removed in version 5.40.0 for "
                       "`LlamaModel.forward`. Use `cache` instead.")


def _shown(message: str, category: type[Warning], module: str) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit(message, category, filename=f"/x/{module.replace('.', '/')}.py", lineno=1,
                               module=module, registry={})
    return bool(caught)


def test_only_third_party_deprecations_are_silenced():
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        quiet_third_party_bars()
        # The notice as it arrives: attributed (stacklevel) to torch's Module.__call__, or to transformers.
        assert not _shown(TRANSFORMERS_NOTICE, FutureWarning, "torch.nn.modules.module")
        assert not _shown(TRANSFORMERS_NOTICE, FutureWarning, "transformers.models.llama.modeling_llama")
        assert not _shown("`torch_dtype` is deprecated! Use `dtype` instead!", DeprecationWarning,
                          "transformers.modeling_utils")
        # Still shown: our own warnings, other categories, other libraries, other torch modules.
        assert _shown("A sits at its bound", UserWarning, "scalerl.scaling.analysis")
        assert _shown("`x` is deprecated", FutureWarning, "scalerl.runtime.trainer")
        assert _shown("a real problem", UserWarning, "transformers.modeling_utils")
        assert _shown("`y` is deprecated", FutureWarning, "numpy.core")
        assert _shown("`z` is deprecated", FutureWarning, "torch.optim.lr_scheduler")
    # transformers, imported before or after (a role that never loads a model never imports it), keeps
    # its errors only and shows no bars
    from transformers.utils import logging as hf_logging

    assert logging.getLogger("transformers").getEffectiveLevel() == logging.ERROR
    assert not hf_logging.is_progress_bar_enabled()
