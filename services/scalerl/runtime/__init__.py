"""Running the roles: embedded (every role in one process), distributed (one role per process:
`scalerl serve ROLE`, `scalerl run --distributed`) and the learner's training loop.

`ROLES`, the four roles in the order the CLI lists them, lives here, where both the CLI glue
(commands.py) and the role processes (serve.py) read it without importing each other.
"""

ROLES = ("generator", "verifier", "curriculum", "learner")
