"""The compiled record codec (highwater.records._codec), built by every ``pip install``.

The rest of the build is declared in pyproject.toml; setuptools reads only the extension
module from here. It is C against the CPython API (docs/storage.md says why) and needs a
C compiler and Python's headers, which ``make venv`` installs where they are missing.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "highwater.records._codec",
            sources=["services/highwater/records/_codec.c"],
            extra_compile_args=[
                "-O2",
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Wno-unused-parameter",
                "-Wno-missing-field-initializers",
                "-Wno-cast-function-type",
            ],
        )
    ]
)
