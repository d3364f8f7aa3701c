"""TensorBoard output of a federated run: the HParams session (read back from the event files, and through
TensorBoard's own HParams backend) and the partition figure."""

from __future__ import annotations

import glob
import io
import os
import warnings

import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hp_metadata

from helpers import SmallClassifier, classification_dataset, quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAdam, FedAvg
from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule, Partition
from lightning_fed.tensorboard import PARTITION_FIGURE_TAG, flatten_settings, partition_figure

PARTITION_SIZES_TAG = "partition/client_sizes"  # the client-size distribution (issue #32 item 6)
from lightning_fed.datamodules import Partition
from lightning_fed.tensorboard import label_distribution_figure


def _fit(tmp_path, name, server, default_hp_metric=False, rounds=2):
    train, val = classification_dataset(n=120, classes=3, n_val=30, seed=0)
    dm = FederatedDataModule(
        train, val, partitioner=DirichletPartitioner(num_clients=6, alpha=0.5, seed=3), clients_per_round=3,
        batch_size=16, local_epochs=2, data_order="once", seed=7,
    )
    logger = TensorBoardLogger(str(tmp_path), name=name, version=0, default_hp_metric=default_hp_metric)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger, "max_epochs": rounds, "callbacks": [server]}
    torch.manual_seed(0)
    trainer = FederatedTrainer(**kwargs)
    trainer.fit(SmallClassifier(in_features=5, num_classes=3, lr=0.05, dropout=0.1), datamodule=dm)
    return trainer, logger


def _events(log_dir) -> EventAccumulator:
    (path,) = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    acc = EventAccumulator(path, size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    return acc


def _session_hparams(acc: EventAccumulator) -> dict:
    content = acc.PluginTagToContent(hp_metadata.PLUGIN_NAME)[hp_metadata.SESSION_START_INFO_TAG]
    info = hp_metadata.parse_session_start_info_plugin_data(content)
    return {k: getattr(v, v.WhichOneof("kind")) for k, v in info.hparams.items()}


# The settings of _fit written out by hand (FedAdam's defaults: Reddi et al. 2021 Alg. 2; SGD's param group).
EXPECTED = {
    "server_optimizer": "FedAdam", "server_optimizer/lr": 0.03, "server_optimizer/beta1": 0.9,
    "server_optimizer/beta2": 0.99, "server_optimizer/tau": 1e-3, "server_optimizer/initial_accumulator": 1e-6,  # τ² when not given
    "server_optimizer/bias_correction": False, "server_optimizer/weighting": "num_samples", "server_optimizer/convention": "reddi",
    "partitioner": "DirichletPartitioner", "partitioner/num_clients": 6, "partitioner/alpha": 0.5,
    "partitioner/min_partition_size": 10, "partitioner/max_tries": 100, "partitioner/seed": 3,
    "partitioner/method": "per_class", "partitioner/self_balancing": False,
    "num_clients": 6, "clients_per_round": 3,
    "local_work": "FixedLocalWork", "local_work/local_epochs": 2, "local_work/batch_size": 16,
    "data_order": "once", "seed": 7, "client_dropout": 0.0, "over_selection": 0.0, "drop_last": False,
    # #40: every data-module setting, as the data module's parts report them (cohort_sampling was missing)
    "cohort_sampling": "fixed_size", "poisson_draws": "per_client", "eval_clients_per_round": "None", "eval_fraction": "None",
    "eval_local_steps": 0, "eval_csv": "None", "eval_personal_untrained": "global",  # #55
    "data": "FederatedDataModule", "rounds": 2,
    "client_optimizer": "SGD", "client_optimizer/lr": 0.05, "client_optimizer/momentum": 0,
    "client_optimizer/dampening": 0, "client_optimizer/weight_decay": 0, "client_optimizer/nesterov": False,
    "model": "SmallClassifier", "model/in_features": 5, "model/num_classes": 3, "model/lr": 0.05,
    "model/dropout": 0.1,
}


# The readable leading columns of _fit's run (issue #32 item 6), by hand.
LEADING = {"Server optimizer": "FedAdam", "Server optimizer lr": 0.03, "Partitioner": "DirichletPartitioner",
           "Cohort": 3, "Local work": "local_epochs=2, batch_size=16"}
# ... as TensorBoard's HParams tab gets them: the cohort as text, "3", not the number 3 it shows as "3.0000"
LEADING_TB = dict(LEADING, Cohort="3")


def test_hparams_session_holds_the_federated_settings(tmp_path):
    server = FedAdam(lr=0.03, beta1=0.9, beta2=0.99, tau=1e-3)
    _, logger = _fit(tmp_path, "fedadam", server)
    acc = _events(logger.log_dir)
    written = _session_hparams(acc)
    expected = dict(EXPECTED, **LEADING_TB, global_seed=os.environ.get("PL_GLOBAL_SEED", "None"))
    if expected["global_seed"] != "None":
        expected["global_seed"] = int(expected["global_seed"])
    assert set(written) == set(expected)
    for key, value in expected.items():
        assert written[key] == pytest.approx(value) if isinstance(value, float) else written[key] == value, key
    # the experiment summary: the same settings as columns, the validation metric first; no placeholder hp_metric
    content = acc.PluginTagToContent(hp_metadata.PLUGIN_NAME)[hp_metadata.EXPERIMENT_TAG]
    experiment = hp_metadata.parse_experiment_plugin_data(content)
    assert sorted(h.name for h in experiment.hparam_infos) == sorted(written)
    assert [m.name.tag for m in experiment.metric_infos][0] == "val_loss"
    assert "hp_metric" not in acc.Tags()["scalars"]
    assert {"round_train_loss", "val_loss"} <= set(acc.Tags()["scalars"])
    # and in hparams.yaml through the logger's log_hyperparams
    assert logger.hparams["server_optimizer/lr"] == pytest.approx(0.03)
    assert logger.hparams["partitioner/alpha"] == 0.5


def test_hparams_tab_compares_two_runs(tmp_path):
    """TensorBoard's own HParams backend, on a log dir with a FedAdam and a FedAvg run: the table's columns are the
    settings of one run's experiment summary (the common ones, whichever run it is) and the logged scalars, the
    validation metric first; both runs are rows with their own server optimizer."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    _fit(tmp_path, "fedadam", FedAdam(lr=0.03))
    _fit(tmp_path, "fedavg", FedAvg(lr=1.0))
    logdir = str(tmp_path)
    mux = plugin_event_multiplexer.EventMultiplexer().AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    ctx = backend_context.Context(base_plugin.TBContext(logdir=logdir, multiplexer=mux, data_provider=provider))
    request = context.RequestContext()
    experiment = ctx.experiment_from_metadata(
        request, "", True, ctx.hparams_metadata(request, ""), ctx.hparams_from_data_provider(request, "", None)
    )
    hparams = {h.name: h for h in experiment.hparam_infos}
    assert {"server_optimizer", "server_optimizer/lr", "partitioner/alpha", "clients_per_round",
            "local_work/local_epochs", "data_order", "seed"} <= set(hparams)
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics[0] == "val_loss" and {"round_train_loss", "round_pseudo_grad_norm"} <= set(metrics)
    from tensorboard.plugins.hparams import api_pb2, list_session_groups

    request_pb = api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=10, allowed_statuses=[
        api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING])
    groups = list_session_groups.Handler(request, ctx, "", request_pb).run().session_groups
    assert sorted(g.hparams["server_optimizer"].string_value for g in groups) == ["FedAdam", "FedAvg"]


def test_warns_when_lightning_wrote_the_hparams_session_first(tmp_path):
    with pytest.warns(UserWarning, match="default_hp_metric=False"):
        _, logger = _fit(tmp_path, "hp", FedAvg(), default_hp_metric=True, rounds=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|LeafSpec).*")
        _fit(tmp_path, "no_hp", FedAvg(), default_hp_metric=False, rounds=1)


def test_partition_figure_is_written_as_an_image(tmp_path):
    _, logger = _fit(tmp_path, "fig", FedAvg(), rounds=1)
    acc = _events(logger.log_dir)
    (image,) = acc.Images(PARTITION_FIGURE_TAG)
    assert (image.width, image.height) == (640, 480)  # the 6.4 x 4.8 in figure at 100 dpi, not 8-px cells
    from matplotlib.image import imread

    pixels = imread(io.BytesIO(image.encoded_image_string), format="png")
    assert pixels.shape[:2] == (480, 640) and pixels[..., :3].std() > 0.05  # drawn, not blank
    (text,) = acc.Tensors("partition/stats/text_summary")
    assert b"num_clients: 6" in text.tensor_proto.string_val[0]


def test_partition_figure_axes_colour_scale_and_values():
    # client 0: classes 0,0,1 ; client 1: class 2 ; client 2: classes 1,2,2,2
    labels = np.array([0, 0, 1, 2, 1, 2, 2, 2])
    p = Partition.from_client_lists([[0, 1, 2], [3], [4, 5, 6, 7]], labels=labels)
    fig = partition_figure(p)
    ax, bar_ax = fig.axes
    assert ax.get_xlabel() == "class" and ax.get_ylabel() == "client"
    assert bar_ax.get_ylabel() == "fraction of the client's samples"
    assert "3 clients, 3 classes" in ax.get_title()
    (image,) = ax.get_images()
    assert image.get_clim() == (0.0, 1.0) and image.get_cmap().name == "viridis"
    expected = np.array([[2 / 3, 1 / 3, 0.0], [0.0, 0.0, 1.0], [0.0, 1 / 4, 3 / 4]])
    np.testing.assert_allclose(np.asarray(image.get_array()), expected, rtol=0, atol=1e-15)
    # the first max_clients rows, titled as a subset
    top = partition_figure(p, max_clients=2)
    np.testing.assert_allclose(np.asarray(top.axes[0].get_images()[0].get_array()), expected[:2], atol=1e-15)
    assert "clients 0-1 of 3" in top.axes[0].get_title()
    with pytest.raises(ValueError, match="no `labels`"):
        partition_figure(Partition.from_client_lists([[0], [1]]))
    with pytest.raises(ValueError, match="max_clients"):
        partition_figure(p, max_clients=0)


def test_flatten_settings_gives_plain_values():
    flat = flatten_settings("data", {
        "partitioner": DirichletPartitioner(num_clients=4, alpha=0.3, seed=1),
        "sizes": np.arange(100), "short": (1, 2), "none": None, "n": np.int64(3), "x": torch.tensor(0.5),
        "nested": {"a": {"b": True}},
    })
    assert flat == {
        "data/partitioner": "DirichletPartitioner", "data/partitioner/num_clients": 4,
        "data/partitioner/alpha": 0.3, "data/partitioner/min_partition_size": 10, "data/partitioner/max_tries": 100,
        "data/partitioner/seed": 1, "data/partitioner/method": "per_class", "data/partitioner/self_balancing": False,
        "data/sizes": "int64[100]", "data/short": "[1, 2]", "data/none": "None", "data/n": 3, "data/x": 0.5,
        "data/nested/a/b": True,
    }
    assert all(type(v) in (bool, int, float, str) for v in flat.values())


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


# ---------------------------------------------------------------------------------------------- issue #32 item 6
def _hparams_experiment(logdir):
    """TensorBoard's own HParams backend on ``logdir``: (experiment proto, backend context, request context)."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    mux = plugin_event_multiplexer.EventMultiplexer().AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    ctx = backend_context.Context(base_plugin.TBContext(logdir=logdir, multiplexer=mux, data_provider=provider))
    request = context.RequestContext()
    experiment = ctx.experiment_from_metadata(
        request, "", True, ctx.hparams_metadata(request, ""), ctx.hparams_from_data_provider(request, "", None)
    )
    return experiment, ctx, request


def test_custom_scalars_layout_opens_on_the_curves_that_matter(tmp_path):
    """The Custom Scalars tab's first category holds validation, round loss, ‖Δ_t‖ and gradient diversity, and each
    chart's regexes match exactly those logged tags (as TensorBoard matches them: ``re.match``)."""
    import re

    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import metadata as cs_metadata

    _, logger = _fit(tmp_path, "cs", FedAdam(lr=0.03), rounds=2)
    acc = _events(logger.log_dir)
    event = acc.Tensors(cs_metadata.CONFIG_SUMMARY_TAG)[0]  # fit start's (written again as val_* metrics appear)
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    first = layout.category[0]
    assert first.title == "Federated training"
    scalars = set(acc.Tags()["scalars"])

    def matched(chart):
        return sorted(t for t in scalars if any(re.match(r, t) for r in chart.multiline.tag))

    assert [matched(c) for c in first.chart] == [
        ["round_train_loss"], ["round_pseudo_grad_norm"], ["round_gradient_diversity"],
    ]  # the layout of fit start: no validation metric logged yet
    assert matched(layout.category[1].chart[2]) == sorted(t for t in scalars if t.startswith("round_clients"))


class _WithAccuracy(SmallClassifier):
    """SmallClassifier that also logs the validation accuracy (``val_acc``, ~0.4, next to a ``val_loss`` of ~1)."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())


def _fit_with_accuracy(tmp_path, name, server, rounds=2):
    train, val = classification_dataset(n=120, classes=3, n_val=30, seed=0)
    dm = FederatedDataModule(train, val, partitioner=DirichletPartitioner(num_clients=6, alpha=0.5, seed=3),
                             clients_per_round=3, batch_size=16, local_epochs=1, seed=7)
    logger = TensorBoardLogger(str(tmp_path), name=name, version=0, default_hp_metric=False)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger, "max_epochs": rounds, "callbacks": [server]}
    torch.manual_seed(0)
    FederatedTrainer(**kwargs).fit(_WithAccuracy(in_features=5, num_classes=3, lr=0.05), datamodule=dm)
    return logger


def test_custom_scalars_one_chart_per_validation_metric(tmp_path):
    """Issue #43: ``val_loss`` and ``val_acc`` were drawn on one axis (an accuracy of ~0.4 flat under a loss of ~1).
    TensorBoard's own Custom Scalars backend (it takes a run's latest layout) shows one chart per validation
    metric, first in "Federated training", each matching exactly its tag."""
    import json
    import re

    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.custom_scalar import custom_scalars_plugin

    logger = _fit_with_accuracy(tmp_path, "acc", FedAdam(lr=0.03))
    logdir = str(tmp_path)
    mux = plugin_event_multiplexer.EventMultiplexer().AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    plugin = custom_scalars_plugin.CustomScalarsPlugin(
        base_plugin.TBContext(logdir=logdir, multiplexer=mux, data_provider=provider))
    layout = plugin.layout_impl(context.RequestContext(), "")
    layout = json.loads(layout) if isinstance(layout, str) else layout
    first = layout["category"][0]
    assert first["title"] == "Federated training"
    titles = [c["title"] for c in first["chart"]]
    assert titles[:3] == ["val_acc (global model)", "val_loss (global model)", "round_train_loss"]
    scalars = set(_events(logger.log_dir).Tags()["scalars"])
    for chart, tag in zip(first["chart"][:2], ("val_acc", "val_loss")):
        assert [t for t in scalars if any(re.match(r, t) for r in chart["multiline"]["tag"])] == [tag]


def test_hparams_metric_columns_open_on_the_validation_metrics(tmp_path):
    """Issue #43: TensorBoard ordered the metric columns by name and ticks the first five, so ``val_acc`` came after
    every ``round_*`` scalar. TensorBoard's own HParams backend now lists ``val_acc``, ``val_loss`` first (marked
    validation), the leading settings first among the columns, and the cohort as ``"3"``."""
    from tensorboard.plugins.hparams import api_pb2, list_session_groups

    _fit_with_accuracy(tmp_path, "a", FedAdam(lr=0.03))
    _fit_with_accuracy(tmp_path, "b", FedAvg())
    experiment, ctx, request = _hparams_experiment(str(tmp_path))
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics[:2] == ["val_acc", "val_loss"] and "round_train_loss" in metrics[2:] and "epoch" not in metrics
    assert [m.dataset_type for m in experiment.metric_infos[:2]] == [api_pb2.DATASET_VALIDATION] * 2
    assert [h.name for h in experiment.hparam_infos][:5] == sorted(LEADING)  # names ticked first
    cohort = {h.name: h for h in experiment.hparam_infos}["Cohort"]
    assert cohort.type == api_pb2.DATA_TYPE_STRING
    handler = list_session_groups.Handler(request, ctx, "", api_pb2.ListSessionGroupsRequest(
        start_index=0, slice_size=10, allowed_statuses=[api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS,
                                                        api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING]))
    groups = handler.run().session_groups
    assert [g.hparams["Cohort"].string_value for g in groups] == ["3", "3"]
    for group in groups:  # each row has its values for the leading metric columns
        assert {v.name.tag for v in group.metric_values} >= {"val_acc", "val_loss"}


def test_hparams_lead_with_the_federated_settings_and_equal_runs_stay_apart(tmp_path):
    """Two runs with equal settings: TensorBoard lists the federated summary as the first five columns (the ones it
    ticks by default) and keeps the runs as two session groups (trial id = log directory)."""
    from tensorboard.plugins.hparams import api_pb2, list_session_groups

    _, first = _fit(tmp_path, "a", FedAdam(lr=0.03), rounds=1)
    _, second = _fit(tmp_path, "b", FedAdam(lr=0.03), rounds=1)
    experiment, ctx, request = _hparams_experiment(str(tmp_path))
    names = [h.name for h in experiment.hparam_infos]
    assert names[:5] == ["Cohort", "Local work", "Partitioner", "Server optimizer", "Server optimizer lr"]
    groups = set()
    for logger in (first, second):
        content = _events(logger.log_dir).PluginTagToContent(hp_metadata.PLUGIN_NAME)[hp_metadata.SESSION_START_INFO_TAG]
        info = hp_metadata.parse_session_start_info_plugin_data(content)
        assert info.group_name == os.path.normpath(logger.log_dir)
        groups.add(info.group_name)
    assert len(groups) == 2
    handler = list_session_groups.Handler(
        request, ctx, "", api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=10, allowed_statuses=[
            api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING]),
    )
    assert handler.run().total_size == 2


def _fit_unlabelled_iid(tmp_path, num_clients, labelled):
    from torch.utils.data import TensorDataset

    from lightning_fed.datamodules import IIDPartitioner

    train, val = classification_dataset(n=240, classes=3, n_val=30, seed=0)
    if not labelled:
        train = TensorDataset(*train.tensors)  # no `targets`: a partition without labels
    dm = FederatedDataModule(train, val, partitioner=IIDPartitioner(num_clients=num_clients, seed=0),
                             clients_per_round=2, batch_size=16, local_epochs=1)
    logger = TensorBoardLogger(str(tmp_path), name="iid", version=num_clients, default_hp_metric=False)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger, "max_epochs": 1, "callbacks": [FedAvg()]}
    FederatedTrainer(**kwargs).fit(SmallClassifier(in_features=5, num_classes=3), datamodule=dm)
    return dm.partition, _events(logger.log_dir)


def test_unlabelled_partition_logs_size_distribution_and_rounded_stats(tmp_path):
    partition, acc = _fit_unlabelled_iid(tmp_path, 7, labelled=False)
    assert partition.labels is None
    assert set(acc.Tags()["images"]) == {PARTITION_SIZES_TAG}  # no per-client bars of arbitrary ids
    (text,) = acc.Tensors("partition/stats/text_summary")
    text = text.tensor_proto.string_val[0].decode()
    sizes = np.sort(partition.sizes())
    assert sizes.sum() == 240 and "None" not in text and "num_classes" not in text
    lines = dict(line.split(": ") for line in text.split("  \n"))
    # 240 samples over 7 clients: sizes 34 or 35; quantiles by numpy, rounded to 3 significant digits
    assert lines["num_samples"] == "240" and lines["size_min"] == str(sizes.min())
    assert lines["size_mean"] == "34.3"  # 240 / 7 = 34.2857...
    assert lines["size_p90"] == f"{float(np.quantile(sizes, 0.9)):.3g}".rstrip("0").rstrip(".")


def test_many_labelled_clients_skip_the_per_client_bars(tmp_path):
    _, acc = _fit_unlabelled_iid(tmp_path, 120, labelled=True)
    assert set(acc.Tags()["images"]) == {PARTITION_SIZES_TAG, PARTITION_FIGURE_TAG}
    _, acc = _fit_unlabelled_iid(tmp_path, 6, labelled=True)
    assert set(acc.Tags()["images"]) == {PARTITION_SIZES_TAG, PARTITION_FIGURE_TAG, "partition/label_distribution"}


def test_client_size_figure_histogram_on_log_bins_with_quantiles():
    from lightning_fed.tensorboard import client_size_figure

    sizes = [1, 2, 2, 3, 10, 40, 100, 1000]
    offsets = np.cumsum([0] + sizes)
    p = Partition.from_client_lists([list(range(a, b)) for a, b in zip(offsets[:-1], offsets[1:])])
    fig = client_size_figure(p, bins=3)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_ylabel() == "number of clients"
    # bins: 1 .. 10 .. 100 .. 1000 (log-spaced); counts by hand: {1,2,2,3}, {10,40}, {100,1000}
    heights = [patch.get_height() for patch in ax.patches]
    assert heights == [4, 2, 2]
    np.testing.assert_allclose([patch.get_x() for patch in ax.patches], [1, 10, 100], rtol=1e-12)
    lines = [line.get_xdata()[0] for line in ax.get_lines()]
    np.testing.assert_allclose(lines, np.quantile(sizes, [0.1, 0.25, 0.5, 0.75, 0.9]))
    assert "8 clients, 1,158 samples" in ax.get_title()


def test_csv_logger_hparams_yaml_gets_the_federated_settings(tmp_path):
    """Issue #32 item 8: the CSV logger's hparams.yaml held only the module's settings."""
    import yaml
    from lightning.pytorch.loggers import CSVLogger

    train, val = classification_dataset(n=120, classes=3, n_val=30, seed=0)
    dm = FederatedDataModule(train, val, partitioner=DirichletPartitioner(num_clients=6, alpha=0.5, seed=3),
                             clients_per_round=3, batch_size=16, local_epochs=2, data_order="once", seed=7)
    logger = CSVLogger(str(tmp_path), name="csv", version=0)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger, "max_epochs": 1, "callbacks": [FedAdam(lr=0.03)]}
    FederatedTrainer(**kwargs).fit(SmallClassifier(in_features=5, num_classes=3, lr=0.05, dropout=0.1), datamodule=dm)
    with open(os.path.join(logger.log_dir, "hparams.yaml")) as f:
        saved = yaml.safe_load(f)
    for key, value in {**LEADING, "server_optimizer/lr": 0.03, "partitioner/alpha": 0.5, "clients_per_round": 3,
                       "local_work/local_epochs": 2, "lr": 0.05, "dropout": 0.1}.items():
        assert saved[key] == pytest.approx(value) if isinstance(value, float) else saved[key] == value, key


def test_csv_metrics_have_one_row_per_round_with_the_logged_values(tmp_path):
    """Issue #32 item 8: metrics.csv had three rows per round (step-level train values, validation, round
    metrics). Now one per round; every value equals the one TensorBoard got at the same step (float32)."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    train, val = classification_dataset(n=120, classes=3, n_val=30, seed=0)
    dm = FederatedDataModule(train, val, partitioner=DirichletPartitioner(num_clients=6, alpha=0.5, seed=3),
                             clients_per_round=3, batch_size=16, local_epochs=1, seed=7)
    csv_logger = CSVLogger(str(tmp_path), name="csv", version=0)
    tb_logger = TensorBoardLogger(str(tmp_path), name="tb", version=0, default_hp_metric=False)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": [tb_logger, csv_logger], "max_epochs": 3,
                                               "callbacks": [FedAvg()]}
    FederatedTrainer(**kwargs).fit(SmallClassifier(in_features=5, num_classes=3), datamodule=dm)
    with open(os.path.join(csv_logger.log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [(r["epoch"], r["step"]) for r in rows] == [("0", "0"), ("1", "1"), ("2", "2")]
    acc = _events(tb_logger.log_dir)
    for name in ("round_train_loss", "round_pseudo_grad_norm", "train_loss_step", "train_loss_epoch", "val_loss"):
        logged = {e.step: e.value for e in acc.Scalars(name)}
        assert sorted(logged) == [0, 1, 2], name
        for row in rows:
            assert float(row[name]) == pytest.approx(logged[int(row["step"])], rel=1e-6), name


# ------------------------------------------------------------------------------------------------ #50.3 personal metrics
def _fit_evaluated(tmp_path, name, server, rounds=2):
    """_fit_with_accuracy's run with federated evaluation on every client (20 % of each client's share held out)."""
    train, val = classification_dataset(n=120, classes=3, n_val=30, seed=0)
    dm = FederatedDataModule(train, val, partitioner=DirichletPartitioner(num_clients=6, alpha=0.5, seed=3),
                             clients_per_round=3, batch_size=16, local_epochs=1, seed=7,
                             eval_clients_per_round="all", eval_fraction=0.2)
    logger = TensorBoardLogger(str(tmp_path), name=name, version=0, default_hp_metric=False)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger, "max_epochs": rounds, "callbacks": [server]}
    torch.manual_seed(0)
    trainer = FederatedTrainer(**kwargs)
    trainer.fit(_WithAccuracy(in_features=5, num_classes=3, lr=0.05), datamodule=dm)
    return trainer, logger


def test_50_custom_scalars_group_federated_and_personal_evaluation(tmp_path):
    """Issue #50 item 3: Custom Scalars had no chart for fed_* or fed_personal_*. TensorBoard's own Custom Scalars
    backend (the run's latest layout) now shows, after "Federated training", a category for the global model on the
    clients (fed_*) and one for the personal models (fed_personal_*), one chart per validation metric whose two
    regexes match exactly its weighted mean and its worst 10 %."""
    import json
    import re

    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.custom_scalar import custom_scalars_plugin

    from lightning_fed.callbacks import FedPer

    _, logger = _fit_evaluated(tmp_path, "fedper", FedPer(head=["net.3"]))
    logdir = str(tmp_path)
    mux = plugin_event_multiplexer.EventMultiplexer().AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    plugin = custom_scalars_plugin.CustomScalarsPlugin(
        base_plugin.TBContext(logdir=logdir, multiplexer=mux, data_provider=provider))
    layout = plugin.layout_impl(context.RequestContext(), "")
    layout = json.loads(layout) if isinstance(layout, str) else layout
    titles = [c["title"] for c in layout["category"]]
    assert titles == ["Federated training", "Federated evaluation (global model on clients)",
                      "Personal models (fed_personal_*)", "Round cost and clients"]
    scalars = set(_events(logger.log_dir).Tags()["scalars"])
    for category, prefix in zip(layout["category"][1:3], ("fed_", "fed_personal_")):
        charts = category["chart"]
        assert [c["title"].split(" ")[0] for c in charts] == ["val_acc", "val_loss"]
        for chart, metric in zip(charts, ("val_acc", "val_loss")):
            matched = sorted(t for t in scalars if any(re.match(r, t) for r in chart["multiline"]["tag"]))
            assert matched == [f"{prefix}{metric}/weighted", f"{prefix}{metric}/worst10"]


def test_50_hparams_compare_methods_on_personal_metrics_and_their_settings(tmp_path):
    """Issue #50 item 3: HParams had no fed_personal_* columns and no method settings. TensorBoard's own HParams
    backend on a FedAvg and a Ditto run (both with federated evaluation): the metric columns after val_* are
    fed_personal_*/weighted, then fed_*/weighted (marked validation), and both rows have a fed_personal_val_acc/weighted
    value (FedAvg's equal to its fed_val_acc/weighted); Ditto's session holds its client half's settings."""
    from tensorboard.plugins.hparams import api_pb2, list_session_groups

    from lightning_fed.callbacks import Ditto

    _fit_evaluated(tmp_path, "a_fedavg", FedAvg())
    _, ditto_logger = _fit_evaluated(tmp_path, "b_ditto", Ditto(lam=0.25))
    experiment, ctx, request = _hparams_experiment(str(tmp_path))
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics[:6] == ["val_acc", "val_loss", "fed_personal_val_acc/weighted", "fed_personal_val_loss/weighted",
                           "fed_val_acc/weighted", "fed_val_loss/weighted"]
    assert [m.dataset_type for m in experiment.metric_infos[:6]] == [api_pb2.DATASET_VALIDATION] * 6
    handler = list_session_groups.Handler(request, ctx, "", api_pb2.ListSessionGroupsRequest(
        start_index=0, slice_size=10, allowed_statuses=[api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS,
                                                        api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING]))
    groups = {g.hparams["server_optimizer"].string_value: g for g in handler.run().session_groups}
    assert set(groups) == {"FedAvg", "Ditto"}
    for group in groups.values():
        assert "fed_personal_val_acc/weighted" in {v.name.tag for v in group.metric_values}
    fedavg = {v.name.tag: v.value for v in groups["FedAvg"].metric_values}
    assert fedavg["fed_personal_val_acc/weighted"] == fedavg["fed_val_acc/weighted"]
    written = _session_hparams(_events(ditto_logger.log_dir))
    assert written["client_algorithms"] == "Ditto"
    assert written["client_algorithms/Ditto/lam"] == pytest.approx(0.25)
    assert written["client_algorithms/Ditto/lr"] == "None"


def test_50_client_half_settings_are_hparams_columns(tmp_path):
    """Each client half's own settings (its init args), whether the method's or FederatedTrainer(client_algorithms=)'s,
    are HParams settings ``client_algorithms/<name>/<arg>`` in the run's session."""
    from lightning_fed.algorithms import FedProxClient
    from lightning_fed.callbacks import FedRep

    train, val = classification_dataset(n=120, classes=3, n_val=30, seed=0)
    dm = FederatedDataModule(train, val, partitioner=DirichletPartitioner(num_clients=6, alpha=0.5, seed=3),
                             clients_per_round=3, batch_size=16, local_epochs=1, seed=7, eval_clients_per_round=2,
                             eval_fraction=0.2)
    logger = TensorBoardLogger(str(tmp_path), name="fedrep", version=0, default_hp_metric=False)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger, "max_epochs": 1,
                                               "callbacks": [FedRep(head=["net.3"], head_steps=3)],
                                               "client_algorithms": [FedProxClient(mu=0.5)]}
    FederatedTrainer(**kwargs).fit(SmallClassifier(in_features=5, num_classes=3, lr=0.05), datamodule=dm)
    written = _session_hparams(_events(logger.log_dir))
    assert {k: v for k, v in written.items() if k.startswith("client_algorithms")} == {
        "client_algorithms": "FedRep, FedProx", "client_algorithms/FedRep/head": "['net.3']",
        "client_algorithms/FedRep/head_steps": 3, "client_algorithms/FedProx/mu": 0.5}


# ------------------------------------------------------------------- issue #50 item 5: a resume continues its version
@pytest.mark.parametrize("kind", ["tensorboard", "csv"])
def test_50_resuming_from_a_checkpoint_of_version_0_logs_into_version_0(tmp_path, kind):
    """A fit resumed from Lightning's default checkpoint in ``lightning_logs/version_0/checkpoints/`` logs into
    version_0 again (no version_1); a CSV logger's ``metrics.csv`` keeps rounds 0..1 and gets round 2 appended."""
    from lightning.pytorch.loggers import CSVLogger

    def logger():
        return TensorBoardLogger(str(tmp_path), default_hp_metric=False) if kind == "tensorboard" else CSVLogger(str(tmp_path))

    train = classification_dataset(n=60)
    dm = FederatedDataModule(train, partitioner=DirichletPartitioner(num_clients=4, alpha=1.0), clients_per_round=2,
                             batch_size=16)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"enable_checkpointing": True}
    FederatedTrainer(max_epochs=2, **(kwargs | {"logger": logger()})).fit(SmallClassifier(), datamodule=dm)
    version_0 = tmp_path / "lightning_logs" / "version_0"
    (ckpt,) = (version_0 / "checkpoints").iterdir()
    trainer = FederatedTrainer(max_epochs=3, **(kwargs | {"logger": logger()}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # neither "exists and is not empty" nor "will be deleted"
        trainer.fit(SmallClassifier(), datamodule=dm, ckpt_path=str(ckpt))
    assert trainer.logger.version == 0 and os.listdir(tmp_path / "lightning_logs") == ["version_0"]
    if kind == "csv":
        import csv

        rows = list(csv.DictReader(open(version_0 / "metrics.csv")))
        assert [int(r["step"]) for r in rows if r.get("round_clients")] == [0, 1, 2]
    else:
        assert len(glob.glob(str(version_0 / "events.out.tfevents.*"))) == 2
