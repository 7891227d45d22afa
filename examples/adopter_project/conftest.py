"""The framework's own pytest options: the suite's plugin must not take any of them."""


def pytest_addoption(parser):
    parser.addoption("--model-path", default="/models/ours", help="the model our own tests load")
