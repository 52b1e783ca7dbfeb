# The quick start is two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# at 10^4 operations PyTensor's C and numba backends do not build within compare.py's limit
SHAPE_PEERS_1E4 := symkern,symkern-f64,lambdify-numpy,numba,pytensor-jax,pytensor-jax-f32,casadi-c

.PHONY: demo test test-all lint fuzz bench clean drift-matrix doctor

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,examples]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m symkern demo

# Most of the suite is tracing, lowering and compiling, one thread each: two worker processes
# take the suite from 770 to 489 s on 2 cores. A file runs whole in one worker (its module-level
# kernels are built once). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# benchmarks against the anchors (optional tools in the bench extra) and the peers (peers extra)
bench: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[bench,peers]"
	$(PY) benchmarks/compare.py --out benchmarks/results/full.json
	$(PY) benchmarks/compare.py --peers --out benchmarks/results/peers.json
	$(PY) benchmarks/compare.py --peers --cpu-memory reuse --out benchmarks/results/peers_reuse.json
	$(PY) benchmarks/compare.py --peers --shapes 1e3 --cpu-memory reuse --out benchmarks/results/peers_shapes_1e3.json
	$(PY) benchmarks/compare.py --peers --shapes 1e4 --cpu-memory reuse --tools $(SHAPE_PEERS_1E4) --out benchmarks/results/peers_shapes_1e4.json
	$(PY) benchmarks/scale_shapes.py --out benchmarks/results/scale_shapes.json
	$(PY) benchmarks/report.py benchmarks/results/full.json

# a long fuzzing campaign (make test runs a bounded one)
fuzz: $(STAMP)
	$(PY) tools/fuzz.py --examples 2000

# the long property profile (CI runs the bounded one)
test-all: $(STAMP)
	SYMKERN_SLOW=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# tests/drift at the lowest and newest sympy and jax that pyproject.toml admits
drift-matrix: $(STAMP)
	$(PY) tools/drift_matrix.py

doctor: $(STAMP)
	$(PY) -m symkern doctor

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
