"""The papers' models as plain LightningModules (nothing federated in them)."""

from lightning_fed.models.char_lstm import ShakespeareLSTM
from lightning_fed.models.cnn import FedAwareCNN
from lightning_fed.models.emnist import EMNISTCNN, EMNISTAutoencoder
from lightning_fed.models.lora_lm import LoRACausalLM  # transformers/peft imported only when built
from lightning_fed.models.mnist import MNISTCNN, MNISTMLP
from lightning_fed.models.resnet import ResNet9, ResNet18GN
from lightning_fed.models.stackoverflow import StackOverflowNWP, StackOverflowTagLR
from lightning_fed.models.two_heads import TwoHeadMLP

__all__ = [
    "EMNISTAutoencoder", "EMNISTCNN", "FedAwareCNN", "LoRACausalLM", "MNISTCNN", "MNISTMLP", "ResNet18GN", "ResNet9",
    "ShakespeareLSTM", "StackOverflowNWP", "StackOverflowTagLR", "TwoHeadMLP",
]
