"""What training code imports: ``apply_plan``, dynamic plans, the standalone snippet, Hugging Face and FSDP integration."""
