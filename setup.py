"""Packages for the wheel; everything else is in pyproject.toml.

The migration environment lives at the repository's top level (`alembic/`, next to
`alembic.ini`) and is shipped inside the package as `hango_worker._alembic`: one copy
of the files, mapped at build time.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["hango_worker", "hango_worker.*"]),
        "hango_worker._alembic",
        "hango_worker._alembic.versions",
    ],
    package_dir={"hango_worker._alembic": "alembic"},
)
