"""The sandbox launcher's script: `python -I -S launcher.py KEY=VALUE... -- ARGV...` (scalerl.sandbox.runner
starts it). It makes the sibling modules importable without running the packages' __init__ (the service
side, with its slow imports) and hands over to supervisor.main. The code lives in modules, not here: a
module's bytecode is cached, a script is compiled again at every execution (3 ms)."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    _here = os.path.dirname(os.path.abspath(__file__))
    for _name, _path in (("scalerl", os.path.dirname(_here)), ("scalerl.sandbox", _here)):
        if _name not in sys.modules:
            _package = type(sys)(_name)
            setattr(_package, "__path__", [_path])  # noqa: B010
            sys.modules[_name] = _package
    from scalerl.sandbox.supervisor import main

    sys.exit(main(sys.argv[1:]))
