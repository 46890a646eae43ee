// The official `ollama` npm package on Berth's Ollama API (see common.mjs). Ollama has no
// tool_choice: the required-tool scenario does not apply.
import { Ollama } from 'ollama';
import { z } from 'zod';
import {
  CITY_ASK, FRANCE, TIMEOUT_MS, TURNS, WEATHER_ASK, WEATHER_DESCRIPTION, WEATHER_RESULT, WEATHER_SCHEMA,
  checkCity, checkCityArgs, checkGreen, checkParis, checkWeatherAnswer, main, modelCheck, need, versionOf,
} from './common.mjs';

const GREEDY = { temperature: 0 };
const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: WEATHER_DESCRIPTION, parameters: WEATHER_SCHEMA } },
];
const City = z.object({ name: z.string(), country: z.string() });

// The library takes a fetch: each request gets the timeout.
const client = (host) => new Ollama({
  host,
  fetch: (url, init = {}) => fetch(url, { ...init, signal: AbortSignal.timeout(TIMEOUT_MS) }),
});

async function invoke(base, model) {
  const r = await client(base).chat({ model, options: GREEDY, messages: [{ role: 'user', content: FRANCE }] });
  need(r.done && r.done_reason === 'stop', `done ${r.done} ${r.done_reason}`);
  return checkParis(r.message.content);
}

async function stream(base, model) {
  const parts = [];
  const s = await client(base).chat({ model, options: GREEDY, stream: true, messages: [{ role: 'user', content: FRANCE }] });
  for await (const p of s) parts.push(p);
  need(parts.length && parts.at(-1).done, `${parts.length} parts, the last not done`);
  return `${parts.length} parts: ${checkParis(parts.map((p) => p.message.content ?? '').join(''))}`;
}

async function toolsAuto(base, model) {
  const c = client(base);
  const messages = [{ role: 'user', content: WEATHER_ASK }];
  const r = await c.chat({ model, options: GREEDY, messages, tools: TOOLS });
  const calls = r.message.tool_calls ?? [];
  modelCheck(calls.length, `no call, text ${JSON.stringify(r.message.content)}`);
  need(calls.length === 1, `${calls.length} calls for one question`);
  need(calls[0].function.name === 'get_weather', `called ${calls[0].function.name}`);
  checkCityArgs(calls[0].function.arguments);
  messages.push(r.message); // the library's own message, fed back
  messages.push({ role: 'tool', content: WEATHER_RESULT, tool_name: 'get_weather' });
  const a = await c.chat({ model, options: GREEDY, messages, tools: TOOLS });
  return checkWeatherAnswer(a.message.content);
}

async function structured(base, model) {
  const r = await client(base).chat({
    model, options: GREEDY, messages: [{ role: 'user', content: CITY_ASK }], format: z.toJSONSchema(City),
  });
  const p = City.parse(JSON.parse(r.message.content));
  return checkCity(p.name, p.country);
}

async function multiturn(base, model) {
  const c = client(base);
  const messages = [];
  let r;
  for (const turn of TURNS) {
    messages.push({ role: 'user', content: turn });
    r = await c.chat({ model, options: GREEDY, messages });
    need(r.message.content, `empty reply to ${JSON.stringify(turn)}`);
    messages.push(r.message); // the library's own message, fed back
  }
  return checkGreen(r.message.content);
}

await main(versionOf('ollama'), {
  invoke,
  stream,
  tools_auto: toolsAuto,
  tools_required: "Ollama's API has no tool_choice",
  structured,
  multiturn,
});
