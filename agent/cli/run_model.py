"""Whether `pkb run`'s model can be used: the price table reads, a chat model's client builds (an unknown provider,
a bad URL, a missing key or reasoning settings the model refuses stop here, before any work), and a cost budget
has the model's price."""

from __future__ import annotations

from agent.cli.common import CliError
from agent.model_spec import ModelSpec, parse_model_spec
from agent.model_table import ModelTableError
from agent.providers import ProviderError, make_chat_model
from agent.run_config import RunConfig
from agent.usage import PriceTable, PriceTableError, load_price_table


def check_model(config: RunConfig, spec: ModelSpec | None = None) -> PriceTable:
    """The run's price table; a chat model's client built once (`spec`: config.model, parsed)."""
    spec = spec or parse_model_spec(config.model)
    try:
        prices = load_price_table(config.prices)
    except PriceTableError as err:
        raise CliError(str(err)) from None
    if spec.is_chat_model:
        try:  # builds the client: an unknown provider, a bad URL, a missing key or reasoning settings the model
            # refuses stop here, before any work
            models = config.model_table()
            make_chat_model(spec, base_url=config.base_url, api_key_env=config.api_key_env,
                            temperature=config.temperature, max_output_tokens=config.max_reply_tokens,
                            reasoning=config.reasoning, models=models)
        except (ProviderError, ModelTableError) as err:
            raise CliError(str(err)) from None
    if config.budget.max_cost_usd is not None and prices.price(spec.text) is None:
        raise CliError(f"--budget-cost: the price table {prices.source} has no price for {spec.text}; "
                       "pass --prices FILE with one")
    return prices
