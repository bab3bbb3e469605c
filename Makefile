# One target per experiment: `make <recipe-name>` runs recipes/blip2/<recipe-name>.yaml.
# Set ACCELERATE_CONFIG to change how it launches (accelerate_configs/*.yaml), ARGS to override keys:
#   make opt27-bf16 ARGS="--per_device_train_batch_size 8"

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ACCELERATE_CONFIG ?= accelerate_configs/single.yaml
DATA := data/synthetic_food
ARGS ?=

.PHONY: help venv data demo test clean-outputs
help:
	@echo "make demo    train a tiny BLIP-2 on the synthetic food photos (CPU, a few minutes) and caption held-out ones"
	@echo "make test    run the CPU test suite"
	@echo "make data    write the synthetic dataset to $(DATA)"
	@echo "make <recipe> for each recipes/blip2/<recipe>.yaml: $(RECIPES)"

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

data: $(DATA)/dataset_dict.json
$(DATA)/dataset_dict.json: data/synthetic.py | venv
	$(PY) -m data.synthetic --out $(DATA)

demo: venv data
	$(PY) recipes/train.py recipes/blip2/tiny-opt-demo.yaml $(ARGS)

test: venv
	$(PY) -m pytest $(ARGS)

# GPU recipes train on the synthetic photos drawn at the published 224 px, 512 of them as in the lab.
data-224: $(DATA)-224/dataset_dict.json
$(DATA)-224/dataset_dict.json: data/synthetic.py | venv
	$(PY) -m data.synthetic --out $(DATA)-224 --size 224 --num-train 512 --num-test 64

RECIPES := $(basename $(notdir $(wildcard recipes/blip2/*.yaml)))
GPU_RECIPES := $(filter-out tiny-%,$(RECIPES))
.PHONY: $(RECIPES)
$(filter tiny-%,$(RECIPES)): venv data
	$(PY) recipes/train.py recipes/blip2/$@.yaml $(ARGS)
$(GPU_RECIPES): data-224
	accelerate launch --config_file $(ACCELERATE_CONFIG) recipes/train.py recipes/blip2/$@.yaml $(ARGS)

clean-outputs:
	rm -rf outputs runs
