"""A Ray pool that cannot start stops the run at its first sample with a configuration error saying how to fix
it: no Ray installed, Ray not initialised, and a node where the sandbox cannot isolate (fail closed: the
worker checks isolation on its own node)."""

from __future__ import annotations

import os
import sys

import pytest
from ray_kit import close_pools, own_ray_tmpdir, pool_settings, python_call, sandbox_strands
from slime_helpers import make_args, new_sample, run
from standin_kit import QWEN3_EOS

from slime_strands.errors import ConfigurationError
from slime_strands.sandbox import RayPool, SandboxIsolationError, SandboxPoolError, ensure_isolation
from slime_strands.settings import SandboxSettings
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(300)

_REFUSE = "#!/bin/sh\n[ \"$1\" = --help ] && exit 0\necho '{tool}: No permissions to create new namespace' >&2\nexit 1\n"


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192, eos_tokens=QWEN3_EOS) as srv:
        yield srv


@pytest.fixture(autouse=True)
async def pools_closed():
    yield
    await close_pools()


async def test_without_ray_installed_the_first_sample_says_to_install_it(server, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    args = make_args(server, strands=sandbox_strands(placement="ray"))
    with pytest.raises(SandboxPoolError, match=r"pip install 'slime-strands\[ray\]'"):
        await run(server, args, new_sample(), python_call("print(1)"), "Answer: \\boxed{1}")
    assert not server.generate_requests, "the run stopped before any turn"


async def test_without_ray_initialised_the_first_sample_says_so(server):
    import ray

    assert not ray.is_initialized()
    args = make_args(server, strands=sandbox_strands(placement="ray"))
    with pytest.raises(ConfigurationError, match=r"Ray is not initialised in this process: call ray\.init"):
        await run(server, args, new_sample(), python_call("print(1)"), "Answer: \\boxed{1}")


async def test_a_node_that_cannot_isolate_refuses_to_host_a_worker(tmp_path):
    """Every worker's node is checked: bwrap and unshare refuse there (stand-ins first on the workers' PATH),
    so the pool does not start, naming the node; code never runs unisolated."""
    import ray

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bwrap", "unshare"):
        (bin_dir / tool).write_text(_REFUSE.format(tool=tool))
        (bin_dir / tool).chmod(0o755)
    workers_path = f"{bin_dir}:{os.environ['PATH']}"
    with own_ray_tmpdir():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PATH": workers_path}},
        )
        try:
            settings = SandboxSettings(prewarm=False, **pool_settings(workers=1))
            with pytest.raises(
                SandboxIsolationError, match=r"on the Ray node .*no isolating sandbox backend works"
            ):
                await ensure_isolation(settings)
            pool = RayPool(settings)
            try:
                with pytest.raises(SandboxIsolationError):
                    await pool.run("print('never')")
            finally:
                await pool.aclose()
        finally:
            ray.shutdown()
