"""The framework's own tests, with its own --model-path."""


def test_our_model_path(request):
    assert request.config.getoption("--model-path") == "/models/llama"


def test_something_of_ours():
    assert sum(range(4)) == 6
