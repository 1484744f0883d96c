from vlp.tracking import MultiLogger, flatten


def test_flatten_nested_params():
    assert flatten({"optim": {"lr": 1e-4, "betas": (0.9, 0.98)}, "seed": 0}) == {
        "optim.lr": "0.0001",
        "optim.betas": "[0.9, 0.98]",
        "seed": "0",
    }
    assert len(flatten({"x": "y" * 10_000})["x"]) == 6000


def test_multi_logger_fans_out():
    class Recorder:
        def __init__(self):
            self.calls = []

        def log_metrics(self, metrics, step):
            self.calls.append(("m", metrics, step))

        def log_params(self, params):
            self.calls.append(("p", params))

    a, b = Recorder(), Recorder()
    multi = MultiLogger([a, b])
    multi.log_params({"k": 1})
    multi.log_metrics({"loss": 0.5}, 3)
    assert a.calls == b.calls == [("p", {"k": 1}), ("m", {"loss": 0.5}, 3)]
