# Pipeline targets: compile the KFP pipelines, run the DAG locally or on a cluster, schedule re-evaluation.
# Without KFP_HOST, `make pipeline-run` runs the whole DAG on this machine (kfp.local, configs/pipeline-local.yaml, CPU);
# PIPELINE_DATA_ROOT=s3://bucket/prefix puts its large outputs in object storage (AWS_* from the environment);
# PARAMS="key=value ..." sets pipeline parameters locally as it does on a cluster; FAMILY=albef picks ALBEF's DAG;
# PIPELINE=retrieval runs vlp-retrieval (no pre-training; FAMILY defaults to ts2net there); PIPELINE=index runs
# vlp-index (PARAMS="model=URI frames=URI [dataset=URI split=S index_uri=URI]"). A rerun into the same
# PIPELINE_OUT reuses every unchanged step from KFP's cache (CACHE=0 runs them all); VERBOSE=1 keeps kfp.local's log.
# RUNNER=container runs each task in `make image-test`'s image as a pod runs it (uid 10001, read-only root), through
# podman's Docker API (scripts/podman-service.sh, started here), reaching the object store's and MLflow's ports on
# this machine's loopback and nothing else (NETWORK=host: this machine's network); STEP_CONFIG=configs/tiny.yaml
# picks the step config.
# With KFP_HOST it compiles and submits: make pipeline-run KFP_HOST=http://kfp.example PARAMS="data_root=s3://bucket/vlp"
KFP_HOST ?=
KFP_NAMESPACE ?= kubeflow
KFP_EXPERIMENT ?= vlp
PARAMS ?=
PIPELINE ?= pretrain
FAMILY ?= $(if $(filter retrieval,$(PIPELINE)),ts2net,alpro)
RUN_PIPELINE = $(if $(filter retrieval index,$(PIPELINE)),$(PIPELINE),$(if $(filter alpro,$(FAMILY)),pretrain,pretrain-$(FAMILY)))
PIPELINE_OUT ?= runs/pipeline-local
PIPELINE_DATA_ROOT ?=
CACHE ?= 1
VERBOSE ?= 0
RUNNER ?= subprocess
NETWORK ?= loopback
STEP_CONFIG ?=
CRON ?= 0 0 3 * * *
SCHEDULE_NAME ?= vlp-reevaluate-nightly
SUBMIT = $(PY) -m pipelines.submit
SUBMIT_ARGS = --host "$(KFP_HOST)" --namespace "$(KFP_NAMESPACE)" --experiment "$(KFP_EXPERIMENT)" \
	$(foreach p,$(PARAMS),--param '$(p)')

.PHONY: pipeline-compile pipeline-run schedule-eval

pipeline-compile: $(STAMP) ## Compile the KFP pipelines into pipelines/compiled/*.yaml (commit the result)
	$(PY) -m pipelines.compile

pipeline-run: $(STAMP) ## Whole DAG [FAMILY=alpro|albef, PIPELINE=retrieval FAMILY=ts2net, or PIPELINE=index PARAMS="model=.. frames=.."]: locally with kfp.local [RUNNER=container: each task in make image-test's image; STEP_CONFIG=file], or with KFP_HOST=URL [PARAMS="k=v ..."] on KFP
ifeq ($(strip $(KFP_HOST)),)
	$(if $(filter container,$(RUNNER)),eval "$$(scripts/podman-service.sh start .cache/podman)" &&) \
	$(PY) -m pipelines.local_run --out $(PIPELINE_OUT) --pipeline $(PIPELINE) --family $(FAMILY) \
		$(if $(strip $(PIPELINE_DATA_ROOT)),--data-root "$(PIPELINE_DATA_ROOT)") $(foreach p,$(PARAMS),--param '$(p)') \
		$(if $(filter 0,$(CACHE)),--no-cache) $(if $(filter 1,$(VERBOSE)),--verbose) \
		$(if $(filter container,$(RUNNER)),--runner container $(if $(filter host,$(NETWORK)),--network host)) $(if $(strip $(STEP_CONFIG)),--step-config $(STEP_CONFIG))
else
	$(PY) -m pipelines.compile
	$(SUBMIT) run --pipeline $(RUN_PIPELINE) $(SUBMIT_ARGS) $(if $(filter retrieval,$(PIPELINE)),--param 'family=$(FAMILY)')
endif

schedule-eval: $(STAMP) ## Create/replace the recurring re-evaluation run: KFP_HOST=URL [CRON="0 0 3 * * *" SCHEDULE_NAME=..] PARAMS="test_dataset=s3://.. test_frames=s3://.."
	$(PY) -m pipelines.compile
	$(SUBMIT) schedule --pipeline reevaluate --name "$(SCHEDULE_NAME)" --cron "$(CRON)" $(SUBMIT_ARGS)
