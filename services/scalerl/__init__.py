"""scalerl: reinforcement learning of LLMs on verifiable tasks with the ScaleRL recipe.

Importing the package does nothing beyond defining names (no I/O, no environment reads).
"""

__version__ = "0.1.0"
