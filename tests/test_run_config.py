"""The run config: recipes + overrides into RunConfig, cross-section checks, and the checks that need the
world size (run before any process group)."""
import pytest

from cplm_megatron.config.loader import apply_overrides
from cplm_megatron.data.config import BatchShape
from cplm_megatron.errors import ConfigError
from cplm_megatron.run_config import build_run_config, load_run_config, run_config_from_saved

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_overrides_parse_types_and_nesting():
    tree = apply_overrides({}, ["train.lr=3e-4", "parallel.tp=2", "parallel.sp=true", "run.dir=runs/x"])
    cfg = build_run_config({**tree, "train": {**tree["train"], "iters": 5}})
    assert cfg.train.lr == pytest.approx(3e-4) and isinstance(cfg.train.lr, float)  # YAML reads "3e-4" as a string
    # (the parsed float of "3e-4" is within an ulp; pytest.approx default rel 1e-6)
    assert cfg.parallel.tp == 2 and cfg.parallel.sp is True and cfg.run.dir == "runs/x"


def test_recipe_then_overrides_apply_last():
    cfg = load_run_config(str(REPO / "configs/tiny.yaml"), ["train.iters=7", "model.num_layers=2", "copy_head.enabled=false"])
    assert cfg.train.iters == 7 and cfg.model.num_layers == 2 and not cfg.copy_head.enabled
    assert cfg.model.hidden_size == 128  # from the `tiny` preset
    # the batch shape has one home: train.*, handed to the loaders as a BatchShape; the data section has no copy
    assert cfg.train.shape == BatchShape(cfg.train.seq_len, cfg.train.micro_batch, cfg.train.global_batch)
    assert not {"seq_len", "micro_batch", "global_batch"} & set(cfg.to_dict()["data"])


def test_unknown_key_names_key_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key 'parallel\.tpp'.*did you mean 'parallel\.tp'"):
        load_run_config(None, ["parallel.tpp=2"])
    with pytest.raises(ConfigError, match=r"unknown config key 'bogus'"):
        load_run_config(None, ["bogus.x=1"])


@pytest.mark.parametrize("override, message", [
    ("train.micro_batch=two", r"train\.micro_batch: expected an integer"),
    ("parallel.sp=maybe", r"parallel\.sp: expected true/false"),
    ("copy_head.impl=magic", r"copy_head\.impl: 'magic' is not one of"),
    ("model.preset=nope", r"unknown model\.preset 'nope'"),
    ("parallel.sp=true", r"parallel\.sp=true needs parallel\.tp >= 2"),
    ("data.seq_len=128", r"data\.seq_len is set by train\.seq_len"),
    ("train.global_batch=6", r"train\.global_batch=6 is not a multiple of train\.micro_batch=4"),
    # every number finite (issue 43 item 8: train.lr=inf trained NaN weights and exited 0)
    ("train.lr=inf", r"^train\.lr must be a finite number, got inf$"),
    ("optimizer.clip_grad=nan", r"^optimizer\.clip_grad must be a finite number, got nan$"),
    ("model.rope_theta=.inf", r"^model\.rope_theta must be a finite number, got inf$"),
    ("copy_head.lm_loss_weight=inf", r"^copy_head\.lm_loss_weight must be a finite number, got inf$"),
    ("data.seed=nan", r"^data\.seed: expected an integer, got 'nan'$"),
])
def test_bad_values_are_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(str(REPO / "configs/tiny.yaml"), [override])


def test_iters_and_tokens_overrides_replace_each_other():
    by_tokens = str(REPO / "configs/smollm2_1p7b.yaml")  # the recipe trains by train.tokens
    cfg = load_run_config(by_tokens, ["train.iters=1000"])  # `sbatch slurm/pretrain_1p7b.sh --set train.iters=1000`
    assert (cfg.train.iters, cfg.train.tokens) == (1000, None)
    cfg = load_run_config(str(REPO / "configs/tiny.yaml"), ["train.tokens=100000"])  # tiny trains by iters
    assert (cfg.train.iters, cfg.train.tokens) == (None, 100000)
    with pytest.raises(ConfigError, match=r"exactly one of train\.iters and train\.tokens"):
        load_run_config(by_tokens, ["train.iters=1000", "train.tokens=5000"])  # both given: still an error


def test_stream_shorthand_and_tokens_budget():
    cfg = load_run_config(None, ["train.iters=null", "train.tokens=10000", "train.global_batch=8",
                                 "train.seq_len=256", "data.streams=a/train,b/train"])
    assert [s.path for s in cfg.data.streams] == ["a/train", "b/train"]
    assert cfg.train.total_iters() == 5  # ceil(10000 / (8 * 256))


@pytest.mark.parametrize("recipe", ["tiny", "smollm2_135m", "smollm2_360m", "smollm2_1p7b", "smollm2_1p7b_32k",
                                    "llama_7b", "llama_13b"])
def test_every_recipe_loads(recipe):
    cfg = load_run_config(str(REPO / f"configs/{recipe}.yaml"))
    assert cfg.model.preset and cfg.train.total_iters() > 0
    if recipe != "tiny":
        assert (cfg.optimizer.beta1, cfg.optimizer.beta2, cfg.optimizer.clip_grad) == (0.9, 0.95, 1.0)
        assert cfg.precision.dtype == "bf16"


@pytest.mark.parametrize("world, overrides, message", [
    (2, ["train.global_batch=6", "train.micro_batch=2"],
     r"train\.global_batch=6 must be a multiple of train\.micro_batch \* data-parallel size = 2 \* 2 = 4"),
    (3, ["parallel.tp=2"], r"world size 3 is not divisible by parallel\.tp\*parallel\.pp\*parallel\.cp"),
    (4, ["parallel.tp=4"], r"KV heads \(model\.num_query_groups=2\) are not divisible by parallel\.tp=4"),
    (2, ["parallel.pp=2", "model.num_layers=3"], r"model\.num_layers=3 is not divisible by parallel\.pp=2"),
])
def test_world_size_checks_name_the_keys(world, overrides, message):
    cfg = load_run_config(str(REPO / "configs/tiny.yaml"), overrides)
    with pytest.raises(ConfigError, match=message):
        cfg.validate_world(world)


def test_world_size_checks_return_the_data_parallel_size():
    cfg = load_run_config(str(REPO / "configs/tiny.yaml"), ["parallel.tp=2", "train.micro_batch=2"])
    assert cfg.validate_world(4) == 2 and cfg.train.shape.num_microbatches(2) == 2  # global batch 8 = 2 x 2 x 2


@pytest.mark.parametrize("recipe", ["tiny", "smollm2_135m", "smollm2_360m", "smollm2_1p7b", "llama_7b", "llama_13b"])
def test_every_recipe_carries_the_studied_default(recipe):
    """The copy-head objective of every recipe is the one the committed multi-seed study decided."""
    import json

    from cplm_megatron.config.loader import parse_override

    decision = json.loads((REPO / "results/study_cpu/summary.json").read_text())["decision"]
    cfg = load_run_config(str(REPO / f"configs/{recipe}.yaml"))
    assert cfg.copy_head.enabled
    for override in decision["overrides"]:
        (section, key), value = parse_override(override)
        assert section == "copy_head" and getattr(cfg.copy_head, key) == value, (recipe, override)


def test_a_saved_config_with_the_old_copy_of_the_batch_shape_under_data_still_reads():
    """Checkpoints written while data.* repeated train.{seq_len, micro_batch, global_batch} stay loadable; a
    user config with data.seq_len is refused (it would be a second home of the shape)."""
    saved = load_run_config(str(REPO / "configs/tiny.yaml"), ["train.seq_len=128"]).to_dict()
    legacy = {**saved, "data": {**saved["data"], "seq_len": 128, "micro_batch": 4, "global_batch": 32}}
    assert run_config_from_saved(legacy).to_dict() == saved
    with pytest.raises(ConfigError, match=r"data\.seq_len is set by train\.seq_len"):
        build_run_config(legacy)


def test_config_yaml_keeps_a_setting_and_what_it_resolved_to_beside_it(tmp_path):
    """model.lm_head_loss=auto was written as the path it resolved to, so a relaunch from config.yaml on another
    machine kept the old choice: the setting stays, the resolution is a comment beside it (and nowhere else)."""
    from cplm_megatron.run_config import dump_run_config

    cfg = load_run_config("tiny", ["model.lm_head_loss=auto"])
    path = tmp_path / "config.yaml"
    dump_run_config(cfg, path, resolved={"model.lm_head_loss": "chunked"})
    text = path.read_text()
    assert "\n  lm_head_loss: auto  # resolved to chunked in this launch\n" in text and text.count("#") == 1, text
    assert load_run_config(str(path)) == cfg
