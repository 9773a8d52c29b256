"""tandem: Lightning-style training on one device, DataParallel or DDP, picked by name."""

__version__ = "0.1.0"
