"""LangChain's `ChatOllama` (langchain-ollama) on Berth's Ollama API (see common.py).

langchain-ollama ignores `tool_choice` (Ollama has none): the required-tool scenario does not
apply.
"""

from common import TIMEOUT, main, version_of
from langchain_ollama import ChatOllama
from lc_common import scenarios


def make(base, model):
    return ChatOllama(model=model, base_url=base, temperature=0, client_kwargs={"timeout": TIMEOUT})


if __name__ == "__main__":
    s = scenarios(make)
    s["tools_required"] = "langchain-ollama ignores tool_choice (Ollama has none)"
    main(version_of("langchain-ollama"), s)
