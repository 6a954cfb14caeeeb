"""`py_pytest`: one Bazel py_test per pytest module, run by tests/bazel_pytest_main.py."""

def py_pytest(name, deps = [], size = "medium"):
    """A py_test running pytest on `<name>.py` of the calling package.

    Args:
      name: the test module's name without `.py`.
      deps: py_library targets the module imports.
      size: Bazel test size (timeout class).
    """
    native.py_test(
        name = name,
        size = size,
        srcs = [
            name + ".py",
            "//tests:bazel_pytest_main.py",
        ],
        args = [native.package_name() + "/" + name + ".py"],
        data = ["//:pyproject.toml"],
        main = "//tests:bazel_pytest_main.py",
        deps = deps,
    )
