"""Checks the Kubernetes manifests in scripts/k8s/ with the Kubeflow operators' own Python models
from PyPI (tests/reference/requirements-kubeflow.txt, installed into .venv-kubeflow/):

- PyTorchJob (kubeflow.org/v1): kubeflow-training 1.9.4, KubeflowOrgV1PyTorchJob;
- TrainJob and ClusterTrainingRuntime (trainer.kubeflow.org/v1alpha1): kubeflow-trainer-api 2.3.0,
  TrainerV1alpha1TrainJob / TrainerV1alpha1ClusterTrainingRuntime (pydantic, types checked);
- MPIJob (kubeflow.org/v2beta1, mpi-operator): no v2beta1 model is on PyPI; kubeflow-training's
  KubeflowOrgV1MPIJob (the same replica specs, run policy and slotsPerWorker) checks everything but
  the v2beta1-only fields sshAuthMountPath, mpiImplementation, launcherCreationPolicy, which are
  checked here by hand against mpi-operator's documented values.

Each document is parsed by its model and serialised back; a field that does not survive the round
trip is unknown to the model (a typo, a wrong level) and fails the check. Prints one OK line per
document; exits 1 naming the file, the document and the field otherwise.
Usage: k8s_manifest_check.py <manifest.yaml>...
"""
import json
import sys

import yaml
from kubeflow.training import ApiClient as TrainingApiClient
import kubeflow_trainer_api.models as trainer

MPIJOB_V2BETA1_ONLY = {
    "sshAuthMountPath": lambda v: isinstance(v, str) and v.startswith("/"),
    "mpiImplementation": lambda v: v in ("OpenMPI", "Intel", "MPICH"),
    "launcherCreationPolicy": lambda v: v in ("AtStartup", "WaitForWorkersReady"),
}


class _Response:
    def __init__(self, doc):
        self.data = json.dumps(doc)


def dropped(original, back, path=""):
    """Paths of keys in `original` that `back` (the model's serialisation) lost."""
    out = []
    if isinstance(original, dict):
        if not isinstance(back, dict):
            return [path or "/"]
        for k, v in original.items():
            if k not in back:
                out.append(f"{path}/{k}")
            else:
                out += dropped(v, back[k], f"{path}/{k}")
    elif isinstance(original, list):
        if not isinstance(back, list) or len(back) != len(original):
            return [path]
        for i, (a, b) in enumerate(zip(original, back)):
            out += dropped(a, b, f"{path}[{i}]")
    return out


def check_training(doc, model):
    client = TrainingApiClient()
    obj = client.deserialize(_Response(doc), model)
    return client.sanitize_for_serialization(obj)


def check_trainer(doc, model):
    obj = getattr(trainer, model).from_dict(doc)
    return obj.to_dict()


def check(doc):
    kind, api = doc.get("kind"), doc.get("apiVersion")
    if (api, kind) == ("kubeflow.org/v1", "PyTorchJob"):
        return check_training(doc, "KubeflowOrgV1PyTorchJob"), "kubeflow-training KubeflowOrgV1PyTorchJob"
    if (api, kind) == ("kubeflow.org/v2beta1", "MPIJob"):
        spec = dict(doc["spec"])
        for field, ok in MPIJOB_V2BETA1_ONLY.items():
            if field in spec:
                value = spec.pop(field)
                if not ok(value):
                    raise ValueError(f"spec.{field}: {value!r} is not a valid v2beta1 value")
        v1 = dict(doc, apiVersion="kubeflow.org/v1", spec=spec)
        back = check_training(v1, "KubeflowOrgV1MPIJob")
        back["spec"].update({k: doc["spec"][k] for k in MPIJOB_V2BETA1_ONLY if k in doc["spec"]})
        back["apiVersion"] = api
        return back, "kubeflow-training KubeflowOrgV1MPIJob + v2beta1 fields"
    if (api, kind) == ("trainer.kubeflow.org/v1alpha1", "TrainJob"):
        return check_trainer(doc, "TrainerV1alpha1TrainJob"), "kubeflow-trainer-api TrainerV1alpha1TrainJob"
    if (api, kind) == ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"):
        return (check_trainer(doc, "TrainerV1alpha1ClusterTrainingRuntime"),
                "kubeflow-trainer-api TrainerV1alpha1ClusterTrainingRuntime")
    raise ValueError(f"no model for apiVersion {api} kind {kind}")


def main(paths):
    failed = 0
    for path in paths:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for i, doc in enumerate(docs):
            name = f"{path} document {i + 1} ({doc.get('kind')} {doc.get('metadata', {}).get('name')})"
            try:
                back, model = check(doc)
                lost = dropped(doc, back)
                if lost:
                    raise ValueError("fields unknown to the model: " + ", ".join(lost))
                print(f"OK {name}: parsed by {model}")
            except Exception as e:  # the model's own validation errors, or ours
                print(f"FAIL {name}: {type(e).__name__}: {e}")
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
