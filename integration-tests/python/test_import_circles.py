"""scripts/import-circles, the CI check that no file of a crate imports one that imports it back (#29).

Each case writes a small crate into a temporary directory and runs the script on it, so the check is shown
to fail on the shapes it must catch (a circle through `use crate::…`, through `super::`, through a `use`
group, through a part of another module) and to pass the shapes Rust code is made of (a module
declaring and re-exporting its own parts, a part using its parent, paths inside strings, comments and
`#[cfg(test)]` blocks). The last case runs it on this workspace, as CI does.
"""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "import-circles"


def run(*crates):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, crates)], capture_output=True, text=True, cwd=REPO)


def crate(tmp_path, files):
    root = tmp_path / "c"
    for name, text in files.items():
        path = root / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "Cargo.toml").write_text('[package]\nname = "c"\n')
    return root


CIRCLES = {
    "crate paths": {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::b::B;\npub struct A;\n",
        "b.rs": "pub struct B;\nfn f() -> crate::a::A { crate::a::A }\n",
    },
    "a use group over three files": {
        "lib.rs": "mod a;\nmod b;\nmod c;\n",
        "a.rs": "use crate::{b::B, c::{C as Renamed}};\npub struct A;\n",
        "b.rs": "pub struct B;\n",
        "c.rs": "use crate::a::A;\npub struct C;\n",
    },
    "siblings through super": {
        "lib.rs": "mod m;\n",
        "m/mod.rs": "mod x;\nmod y;\n",
        "m/x.rs": "use super::y::Y;\npub struct X;\n",
        "m/y.rs": "use super::x::X;\npub struct Y;\n",
    },
    "a part and a module above its parent": {
        "lib.rs": "mod top;\nmod m;\n",
        "top.rs": "use crate::m::part::P;\npub struct T;\n",
        "m.rs": "pub mod part;\n",
        "m/part.rs": "use crate::top::T;\npub struct P;\n",
    },
}


@pytest.mark.parametrize("name", sorted(CIRCLES))
def test_a_circle_fails_and_names_its_files(tmp_path, name):
    root = crate(tmp_path, CIRCLES[name])
    result = run(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 import circle(s)" in result.stdout
    files = [line.split(" -> ")[0].strip() for line in result.stdout.splitlines() if " -> " in line]
    assert files and all("/src/" in f for f in files), result.stdout


def test_what_rust_code_is_made_of_passes(tmp_path):
    root = crate(
        tmp_path,
        {
            # A module declaring, re-exporting and dispatching to its parts; parts using their parent.
            "lib.rs": "pub mod tls;\nmod other;\npub use tls::Conn;\n",
            "tls.rs": "mod client;\nmod pem;\npub use client::Conn;\npub struct Config;\nfn f() { pem::parse(); }\n",
            "tls/client.rs": "use super::{Config, pem};\npub struct Conn(Config);\n",
            "tls/pem.rs": "pub fn parse() {}\n",
            # Names that look like paths but are not code.
            "other.rs": (
                "// use crate::tls::client::Conn;\n"
                '/* crate::tls::Config */ const S: &str = "crate::lib";\n'
                "#[cfg(test)]\nmod tests {\n    use crate::tls::Config;\n}\n"
            ),
        },
    )
    result = run(root)
    assert result.returncode == 0, result.stdout + result.stderr


def test_this_workspace_has_no_circle():
    result = run()
    assert result.returncode == 0, result.stdout
