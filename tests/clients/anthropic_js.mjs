// The official `@anthropic-ai/sdk` npm package on /v1/messages (see common.mjs). The Messages API
// requires max_tokens: every request sends 1024, as Anthropic's own examples do. `temperature: 0`
// goes in the body (the server takes Anthropic's temperature).
import Anthropic from '@anthropic-ai/sdk';
import { zodOutputFormat } from '@anthropic-ai/sdk/helpers/zod';
import { z } from 'zod';
import {
  CITY_ASK, FRANCE, TIMEOUT_MS, TURNS, WEATHER_ASK, WEATHER_DESCRIPTION, WEATHER_RESULT, WEATHER_SCHEMA,
  checkCity, checkCityArgs, checkGreen, checkParis, checkWeatherAnswer, main, modelCheck, need, versionOf,
} from './common.mjs';

const BASE = { max_tokens: 1024, temperature: 0 };
const TOOLS = [{ name: 'get_weather', description: WEATHER_DESCRIPTION, input_schema: WEATHER_SCHEMA }];
const City = z.object({ name: z.string(), country: z.string() });

const client = (base) => new Anthropic({ baseURL: base, apiKey: 'unused', timeout: TIMEOUT_MS, maxRetries: 0 });
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

async function invoke(base, model) {
  const r = await client(base).messages.create({ ...BASE, model, messages: [{ role: 'user', content: FRANCE }] });
  need(r.stop_reason === 'end_turn', `stop_reason ${r.stop_reason}`);
  return checkParis(textOf(r));
}

async function stream(base, model) {
  const s = client(base).messages.stream({ ...BASE, model, messages: [{ role: 'user', content: FRANCE }] });
  let text = '';
  s.on('text', (t) => {
    text += t;
  });
  const final = await s.finalMessage();
  need(final.stop_reason === 'end_turn', `stop_reason ${final.stop_reason}`);
  need(textOf(final) === text, `deltas ${JSON.stringify(text)} != final ${JSON.stringify(textOf(final))}`);
  return checkParis(text);
}

async function roundTrip(base, model, choice) {
  const c = client(base);
  const messages = [{ role: 'user', content: WEATHER_ASK }];
  const r = await c.messages.create({ ...BASE, model, messages, tools: TOOLS, tool_choice: { type: choice } });
  const calls = r.content.filter((b) => b.type === 'tool_use');
  if (choice === 'auto') modelCheck(calls.length, `no call under auto, text ${JSON.stringify(textOf(r))}`);
  need(calls.length, `no tool_use under ${choice}: ${JSON.stringify(textOf(r))} (${r.stop_reason})`);
  need(r.stop_reason === 'tool_use', `stop_reason ${r.stop_reason}`);
  need(calls.length === 1, `${calls.length} calls for one question`);
  need(calls[0].name === 'get_weather', `called ${calls[0].name}`);
  checkCityArgs(calls[0].input);
  messages.push({ role: 'assistant', content: r.content }); // the library's own blocks
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: calls[0].id, content: WEATHER_RESULT }] });
  const a = await c.messages.create({ ...BASE, model, messages, tools: TOOLS });
  need(a.stop_reason === 'end_turn', `stop_reason ${a.stop_reason} after the tool result`);
  return checkWeatherAnswer(textOf(a));
}

async function structured(base, model) {
  const r = await client(base).messages.parse({
    ...BASE, model, messages: [{ role: 'user', content: CITY_ASK }], output_config: { format: zodOutputFormat(City) },
  });
  const p = r.parsed_output;
  need(p && typeof p === 'object', `parsed ${JSON.stringify(p)} from ${JSON.stringify(textOf(r))}`);
  return checkCity(p.name, p.country);
}

async function multiturn(base, model) {
  const c = client(base);
  const messages = [];
  let r;
  for (const turn of TURNS) {
    messages.push({ role: 'user', content: turn });
    r = await c.messages.create({ ...BASE, model, messages });
    need(textOf(r), `empty reply to ${JSON.stringify(turn)}`);
    messages.push({ role: 'assistant', content: r.content }); // the library's own blocks
  }
  return checkGreen(textOf(r));
}

await main(versionOf('@anthropic-ai/sdk'), {
  invoke,
  stream,
  tools_auto: (b, m) => roundTrip(b, m, 'auto'),
  tools_required: (b, m) => roundTrip(b, m, 'any'),
  structured,
  multiturn,
});
