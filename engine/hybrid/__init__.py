"""The hybrid engine: moving the actor's weights between Megatron's training layout and vLLM's."""
