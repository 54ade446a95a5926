"""Runnable examples; ``python -m graphtrainer.examples.node_classification --help``."""
