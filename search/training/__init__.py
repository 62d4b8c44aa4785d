"""What training code imports: ``auto_checkpoint`` (one call: a plan measured, checked and applied), ``apply_plan``, dynamic plans, the standalone snippet, Hugging Face and FSDP integration."""
