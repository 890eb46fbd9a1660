"""Data: formats -> normalised records -> token ids + masks -> batches; LightningDataModules; the toy world."""
