"""The cross-check suite: hypothesis properties proving that the torch path and refimpl agree on counts, operators, genomes, layers and predictions."""
