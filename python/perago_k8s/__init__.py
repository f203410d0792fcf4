"""Python Perago task modules as PeragoTasks: manifests from modules, and the body that runs them."""

__version__ = "0.1.0"
