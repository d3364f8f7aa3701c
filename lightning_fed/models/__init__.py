"""The papers' models as plain LightningModules (nothing federated in them)."""

from lightning_fed.models.char_lstm import ShakespeareLSTM
from lightning_fed.models.cnn import FedAwareCNN

__all__ = ["FedAwareCNN", "ShakespeareLSTM"]
