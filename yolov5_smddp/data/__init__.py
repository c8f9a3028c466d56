"""The input side: data.yaml, label verification and cache, augmentation, datasets and loaders."""
