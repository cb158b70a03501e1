"""A Hugging Face model as its docs teach it: built from a config (nothing downloaded), fed dict
batches by its padding collator (a BatchEncoding: a mapping, not a dict), its loss from
`model(**batch).loss`, `training_step(self, batch)` without batch_idx. It trains on 1x1 and 1x2,
and the figures count its sequences: 90 a epoch, whatever the padded length or the number of
keys (the count that once said 3 samples a batch: input_ids, attention_mask, labels).
"""
from __future__ import annotations

import pytest

from helpers.training import assert_counted, assert_speedup_of, trained_on_one_and_two

# on one xdist worker: each worker would run the module's fixture (real training) again
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hf-module"), pytest.mark.timeout(300)]

HF_MODULE = '''
import random

import pytorch_lightning as pl
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification, DataCollatorWithPadding, PreTrainedTokenizerFast

N, VOCAB = 90, 32


def tokenizer():
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(VOCAB - 2)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]")


class TextData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 16, **_):
        super().__init__()
        self.batch_size = batch_size
        rng = random.Random(0)
        self.samples = []
        for _ in range(N):
            ids = [rng.randrange(2, VOCAB) for _ in range(rng.randrange(3, 20))]
            self.samples.append({"input_ids": ids, "labels": int(sum(ids) % 2)})
        self.collate = DataCollatorWithPadding(tokenizer())

    def train_dataloader(self):
        return DataLoader(self.samples, batch_size=self.batch_size, shuffle=True, collate_fn=self.collate)

    def val_dataloader(self):
        return DataLoader(self.samples, batch_size=self.batch_size, collate_fn=self.collate)


class TinyBert(pl.LightningModule):
    def __init__(self, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = BertForSequenceClassification(BertConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=64, num_labels=2))

    def training_step(self, batch):
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        out = self.model(**batch)
        self.log("val_acc", (out.logits.argmax(-1) == batch["labels"]).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_file) -> dict:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")  # nothing may be downloaded at run time
        return trained_on_one_and_two(tmp_path_factory, HF_MODULE, "hfmod.TinyBert", data_file, "--data-class",
                                      "hfmod.TextData", "--batch-size", "16")


@pytest.mark.parametrize("devices", [1, 2])
def test_a_hugging_face_model_with_a_padding_collator_counts_its_sequences(runs, devices):
    # 90 sequences per epoch (on 1x2, 45 a rank: no padding repeat), every epoch
    assert_counted(*runs[devices], per_epoch=90)
    assert runs[devices][0]["epochs_completed"] == 3 and runs[devices][0]["flops_per_sample"] > 0


def test_the_report_compares_the_sequences_each_topology_trained(runs):
    assert_speedup_of(runs)
