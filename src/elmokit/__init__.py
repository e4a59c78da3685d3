"""elmokit: ELMo deep contextualized word representations in PyTorch."""
