"""HunyuanVideo 1.5's device code: modules that import torch and diffusers when imported (at decode
time only)."""
