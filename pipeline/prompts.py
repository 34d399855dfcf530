"""The one place that builds and parses prompts.

    construction:  target: llvm \n <kernel description> \n ### script \n
    refinement:    target: llvm \n <kernel description> \n ### current script (1.52x baseline) \n
                   <script> \n ### faster script \n

The data stage writes them, training and RL read them, evaluation and `optimize` build them
for new kernels, and the reward reads a refinement prompt's source script back."""

from __future__ import annotations

PROMPT_SCRIPT = "### script\n"
PROMPT_BETTER = "### faster script\n"
CURRENT = "### current script ("


def construction_prompt(description: str, target_name: str) -> str:
    return f"target: {target_name}\n{description}\n{PROMPT_SCRIPT}"


def refinement_prompt(description: str, target_name: str, script: str, speedup_vs_baseline: float) -> str:
    return (f"target: {target_name}\n{description}\n{CURRENT}{speedup_vs_baseline:.2f}x baseline)\n"
            f"{script}\n{PROMPT_BETTER}")


def is_refinement(prompt: str) -> bool:
    return CURRENT in prompt


def source_script(prompt: str) -> str | None:
    """The script a refinement prompt gives, or None for a construction prompt."""
    if CURRENT not in prompt:
        return None
    body = prompt.split(CURRENT, 1)[1].split("\n", 1)[1]
    return body.rsplit("\n" + PROMPT_BETTER, 1)[0]
