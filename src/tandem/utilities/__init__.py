"""Small shared helpers: seeding, rank-zero output, checkpoint files, dataloaders, errors."""
