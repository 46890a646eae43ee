"""LangChain's `ChatOpenAI` (langchain-openai) on /v1/chat/completions (see common.py)."""

from common import TIMEOUT, main, version_of
from langchain_openai import ChatOpenAI
from lc_common import scenarios


def make(base, model):
    return ChatOpenAI(
        model=model, base_url=f"{base}/v1", api_key="unused", temperature=0, timeout=TIMEOUT, max_retries=0
    )


if __name__ == "__main__":
    main(version_of("langchain-openai"), scenarios(make))
