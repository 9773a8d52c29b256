from tandem.callbacks.callback import Callback

__all__ = ["Callback"]
