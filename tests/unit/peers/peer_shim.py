"""The import shim for checking peer runtimes' CLIs and config loaders without their heavy deps.

sglang-omni and vllm-omni are installed `--no-deps` (see conftest.py). Their CLI and config
modules import packages this project does not install and the parsing code never calls: the
engines themselves (sglang, vllm), transports (zmq, msgspec, nixl...), kernels and audio codecs.
`install(names)` puts a finder first on `sys.meta_path` that answers every import of those
top-level names, and of their submodules, with a stub module whose every attribute is a stub
class (callable, subclassable, subscriptable, usable as a decorator). Nothing else is replaced:
pydantic, typer, transformers, torch, yaml and the peers' own modules are the real ones.

Used only inside the checker subprocess (peer_check.py), never in the test process itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __setitem__(cls, item: Any, value: Any) -> None:
        pass

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __add__(cls, other: Any) -> Any:
        return other

    def __radd__(cls, other: Any) -> Any:
        return other

    def __iter__(cls) -> Any:
        return iter(())

    def keys(cls) -> list[Any]:
        return []

    def items(cls) -> list[Any]:
        return []

    def values(cls) -> list[Any]:
        return []

    def __bool__(cls) -> bool:
        return False


class Stub(metaclass=_StubMeta):
    """Anything a stubbed module exports: constructible with any arguments, and a no-op decorator."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Used as a decorator (`@stub` or `@stub(...)`) it hands the function back.
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], type):
            return args[0]
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return Stub()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Stub()

    def __bool__(self) -> bool:
        return False


def _stub_class(name: str) -> type:
    return _StubMeta(name.rpartition(".")[2] or name, (Stub,), {"__module__": "peer_shim.stub"})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so that any submodule can be imported
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _StubFinder(importlib.abc.MetaPathFinder):
    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


def install(names: frozenset[str]) -> None:
    """Answer imports of these packages or modules (and everything under them) with stubs."""
    for loaded in [m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in names)]:
        del sys.modules[loaded]
    sys.meta_path.insert(0, _StubFinder(names))


def define(module: str, **values: Any) -> None:
    """Give a stubbed module real values where the peers' code inspects them (versions, flags)."""
    target = importlib.import_module(module)
    for name, value in values.items():
        setattr(target, name, value)


def bare_package(name: str, directory: str) -> None:
    """Make `name` importable from `directory` without running its `__init__.py`.

    vllm_omni's `__init__` monkeypatches vLLM's engine classes at import; its CLI and config
    subpackages do not need that, so the checker imports them directly.
    """
    module = types.ModuleType(name)
    module.__path__ = [directory]
    sys.modules[name] = module
