# One target per experiment: `make <recipe-name>` runs recipes/blip2/<recipe-name>.yaml.
# Set ACCELERATE_CONFIG to change how it launches (accelerate_configs/*.yaml), ARGS to override keys,
# ACCELERATE_ARGS to add launcher flags (another machine of a multi-machine run: see the README):
#   make opt27-bf16 ARGS="--per_device_train_batch_size 8"
#   make opt27-bf16 ACCELERATE_CONFIG=accelerate_configs/ddp4.yaml

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ACCELERATE_CONFIG ?= accelerate_configs/single.yaml
ACCELERATE_ARGS ?=
DATA := data/synthetic_food
ARGS ?=

.PHONY: help venv data data-224 data-lab demo test ladder clean-outputs
help:
	@echo "make demo    train a tiny BLIP-2 on the synthetic food photos (CPU, a few minutes) and caption held-out ones"
	@echo "make test    run the CPU test suite"
	@echo "make data    write the synthetic dataset to $(DATA)"
	@echo "make alt-text  fill in the alt text of $(HTML) with MODEL= (and ADAPTER=)"
	@echo "make evaluate  score MODEL= (default outputs/tiny-opt-demo) on the synthetic test split"
	@echo "make compatibility  run the compatibility matrix's CPU cells and render docs/compatibility.md"
	@echo "make <recipe> for each recipes/blip2/<recipe>.yaml: $(RECIPES)"

# The engine installs as the one package `altscale` (pyproject.toml), editable: edits need no reinstall, and no
# script touches sys.path. --no-deps: requirements.txt pins every dependency.
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

data: $(DATA)/dataset_dict.json
$(DATA)/dataset_dict.json: data/synthetic.py | venv
	$(PY) -m altscale.data.synthetic --out $(DATA)

# A demo is meant to be rerun: it replaces its previous outputs/tiny-opt-demo instead of refusing to.
demo: venv data
	$(PY) recipes/train.py recipes/blip2/tiny-opt-demo.yaml --overwrite_output_dir true $(ARGS)

test: venv
	$(PY) -m pytest $(ARGS)

# GPU recipes train on the synthetic photos drawn at the published 224 px, 512 of them as in the lab.
data-224: $(DATA)-224/dataset_dict.json
$(DATA)-224/dataset_dict.json: data/synthetic.py | venv
	$(PY) -m altscale.data.synthetic --out $(DATA)-224 --size 224 --num-train 512 --num-test 64

# The lab's own format, on which BLIP-2 speed is measured: 512x384 JPEGs with captions of 8-25 words
# (make opt27-bf16 ARGS="--dataset_path data/synthetic_food-lab"; benchmarks/gpu_move.sh draws the same set).
data-lab: $(DATA)-lab/dataset_dict.json
$(DATA)-lab/dataset_dict.json: data/synthetic.py | venv
	$(PY) -m altscale.data.synthetic --lab --out $(DATA)-lab --num-train 512 --num-test 64

RECIPES := $(basename $(notdir $(wildcard recipes/blip2/*.yaml)))
GPU_RECIPES := $(filter-out tiny-%,$(RECIPES))
.PHONY: $(RECIPES)
$(filter tiny-%,$(RECIPES)): venv data
	$(PY) recipes/train.py recipes/blip2/$@.yaml $(ARGS)
$(GPU_RECIPES): data-224
	accelerate launch --config_file $(ACCELERATE_CONFIG) $(ACCELERATE_ARGS) recipes/train.py recipes/blip2/$@.yaml $(ARGS)
# A multi-GPU recipe launches with the accelerate config its name ends in; ACCELERATE_CONFIG=... still wins.
%-ddp4: ACCELERATE_CONFIG = accelerate_configs/ddp4.yaml
%-fsdp4: ACCELERATE_CONFIG = accelerate_configs/fsdp4.yaml
%-zero3-offload4: ACCELERATE_CONFIG = accelerate_configs/zero3_offload4.yaml

# The lab's single-GPU ladder, each step in its own process; BENCH=1 keeps it to a few steps each.
LADDER ?=
ladder: data-224
	$(PY) benchmarks/ladder.py $(LADDER) $(if $(BENCH),--bench)

clean-outputs:
	rm -rf outputs runs

# --- Alt text: write it, score it (recipes/generate.py, recipes/score.py). MODEL: a fine-tuned folder or Hub
# id, a preset for an untrained baseline (MODEL=blip2-tiny-opt); ADAPTER: a LoRA/QLoRA adapter on it.
MODEL ?= outputs/tiny-opt-demo
ADAPTER ?=
HTML ?= data/sample_page/index.html
ALT_MODEL = $(if $(MODEL),--model_name_or_path $(MODEL)) $(if $(ADAPTER),--adapter $(ADAPTER))
.PHONY: alt-text evaluate
alt-text: venv
	$(PY) recipes/generate.py $(ALT_MODEL) --html $(HTML) $(ARGS)
evaluate: venv data
	$(PY) recipes/score.py $(ALT_MODEL) --dataset_path $(DATA) --split test $(ARGS)

# The compatibility matrix's CPU part (docs/compatibility.md; about 6 minutes on 2 cores): the single-process cells
# in one process, DDP and FSDP under accelerate with 2 gloo processes (launched again with --resume when a cell
# hung or a rank failing alone broke their process group), then the page from these lines and the GPU ones in benchmarks/results
# (bash benchmarks/gpu_compatibility.sh single|multi on the device machine).
COMPAT_CPU := benchmarks/results/$(shell date +%F)-cpu-compatibility.jsonl
COMPAT_ARGS := benchmarks/compatibility.py --out $(COMPAT_CPU) --work-dir runs/compatibility
COMPAT_LAUNCH := $(VENV)/bin/accelerate launch --num_processes 2 --config_file
.PHONY: compatibility compatibility-doc
compatibility: venv
	rm -rf $(COMPAT_CPU) runs/compatibility
	$(PY) $(COMPAT_ARGS) --launch single zero2-offload zero3-offload
	for try in $$(seq 10); do $(COMPAT_LAUNCH) accelerate_configs/ddp4.yaml $(COMPAT_ARGS) --launch ddp --resume && break; done
	for try in $$(seq 10); do $(COMPAT_LAUNCH) accelerate_configs/fsdp4.yaml $(COMPAT_ARGS) --launch fsdp --resume && break; done
	$(PY) benchmarks/compatibility_doc.py
compatibility-doc: venv
	$(PY) benchmarks/compatibility_doc.py
