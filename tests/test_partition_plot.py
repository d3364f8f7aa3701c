"""label_distribution_figure and the `lightning-fed partition` command."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from lightning_fed.cli import main
from lightning_fed.datamodules import Partition
from lightning_fed.tensorboard import label_distribution_figure

LABELS = np.array([0, 0, 1, 2, 1, 2, 2, 2])
P = Partition.from_client_lists([[0, 1, 2], [3], [4, 5, 6, 7]], labels=LABELS)


def bar_widths(fig):
    ax = fig.axes[0]
    return [[patch.get_width() for patch in container] for container in ax.containers]  # [class][client]


def test_counts_and_percent_segments_hand_computed():
    counts = np.array(bar_widths(label_distribution_figure(P))).T
    np.testing.assert_array_equal(counts, [[2, 1, 0], [0, 0, 1], [0, 1, 3]])
    pct = np.array(bar_widths(label_distribution_figure(P, size_unit="percent"))).T
    np.testing.assert_allclose(pct, [[200 / 3, 100 / 3, 0], [0, 0, 100], [0, 25, 75]])
    fig = label_distribution_figure(P)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["0", "1", "2"]
    assert fig.axes[0].get_xlabel() == "number of samples" and fig.axes[0].get_ylabel() == "client"


def test_legend_uses_label_names_and_unlabelled_partitions_plot_sizes():
    p = Partition.from_client_lists([[0], [1, 2]], labels=[0, 1, 1], label_names=np.array(["ham", "spam"]))
    assert [t.get_text() for t in label_distribution_figure(p).legends[0].get_texts()] == ["ham", "spam"]
    sizes = label_distribution_figure(Partition.from_client_lists([[0], [1, 2]]))
    assert bar_widths(sizes) == [[1, 2]] and not sizes.legends


def test_bad_arguments():
    with pytest.raises(ValueError, match="size_unit.*'absolute', 'percent'"):
        label_distribution_figure(P, size_unit="fraction")
    with pytest.raises(ValueError, match="max_clients"):
        label_distribution_figure(P, max_clients=0)
    with pytest.raises(TypeError, match="legend"):
        label_distribution_figure(P, legend="yes")


def test_partition_command_prints_stats_and_saves_the_plot(tmp_path, monkeypatch, capsys):
    from test_mnist import make_mnist_raw

    monkeypatch.chdir(tmp_path)
    info = make_mnist_raw(tmp_path / "data", n_train=80, n_test=20)
    cfg = {
        "trainer": {"max_epochs": 1, "accelerator": "cpu"},
        "model": {"class_path": "lightning_fed.models.mnist.MNISTMLP", "init_args": {"hidden": 8}},
        "data": {"class_path": "lightning_fed.datamodules.mnist.MNISTDataModule",
                 "init_args": {"data_dir": str(tmp_path / "data"), "clients_per_round": 2,
                               "partitioner": {"class_path": "lightning_fed.datamodules.ShardPartitioner",
                                               "init_args": {"num_clients": 4, "shards_per_client": 2}}}},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    main(["partition", "--config", str(tmp_path / "c.yaml"), "--plot", str(tmp_path / "p.png"),
          "--data.init_args.partitioner.init_args.seed", "3"])
    out = capsys.readouterr().out
    from lightning_fed.datamodules import ShardPartitioner

    labels = info["arrays"]["train-labels-idx1-ubyte"].astype(np.int64)
    # the module's train split (val comes from the test files), partitioned independently here
    expected = ShardPartitioner(4, 2, seed=3).partition(len(labels), labels=labels)
    assert "ShardPartitioner(num_clients=4, shards_per_client=2, seed=3" in out
    assert f"num_clients: 4  num_samples: {len(labels)}  num_classes: 10" in out
    for c in range(4):
        row = [c, expected.sizes()[c], *expected.label_histogram()[c]]
        assert " ".join(str(int(v)) for v in row) in " ".join(out.split())
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_partition_command_needs_a_config(capsys):
    with pytest.raises(SystemExit) as err:
        main(["partition", "--plot", "x.png"])
    assert err.value.code == 2 and "--config" in capsys.readouterr().err
