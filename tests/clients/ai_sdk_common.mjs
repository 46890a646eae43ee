// The Vercel AI SDK (`ai`) scenarios, shared by ai_sdk_compatible.mjs (@ai-sdk/openai-compatible:
// /v1/chat/completions) and ai_sdk_openai.mjs (@ai-sdk/openai: /v1/responses with `store` on, so
// the history it sends back refers to earlier output by `item_reference`). See common.mjs.
import { generateText, isStepCount, NoObjectGeneratedError, Output, streamText, tool } from 'ai';
import { z } from 'zod';
import {
  CITY_ASK, FRANCE, TIMEOUT_MS, TURNS, WEATHER_ASK, WEATHER_DESCRIPTION, WEATHER_RESULT,
  checkCity, checkCityArgs, checkGreen, checkParis, checkWeatherAnswer, modelCheck, need,
} from './common.mjs';

// Every call: greedy, no retries, the timeout over the whole call.
const CALL = { temperature: 0, maxRetries: 0, timeout: TIMEOUT_MS };

const TOOLS = {
  get_weather: tool({
    description: WEATHER_DESCRIPTION,
    inputSchema: z.object({ city: z.string().describe('The city, e.g. Paris') }),
    execute: async () => WEATHER_RESULT,
  }),
};
const City = z.object({ name: z.string(), country: z.string() });

/**
 * The scenarios over `make(base, model)`, the provider's language model. `schemaSent`: whether the
 * provider sends structured output's schema (@ai-sdk/openai-compatible by default sends only
 * `response_format: json_object`, so JSON with other keys is the model's answer, not a protocol
 * failure; where the schema is sent the server constrains to it and a mismatch is a FAIL).
 */
export function scenarios(make, { schemaSent }) {
  async function invoke(base, model) {
    const r = await generateText({ ...CALL, model: make(base, model), prompt: FRANCE });
    need(r.finishReason === 'stop', `finishReason ${r.finishReason}`);
    return checkParis(r.text);
  }

  async function stream(base, model) {
    const s = streamText({ ...CALL, model: make(base, model), prompt: FRANCE });
    let text = '';
    let n = 0;
    for await (const t of s.textStream) {
      text += t;
      n += 1;
    }
    const finish = await s.finishReason;
    need(finish === 'stop', `finishReason ${finish} after ${n} parts`);
    need((await s.text) === text, `parts ${JSON.stringify(text)} != text ${JSON.stringify(await s.text)}`);
    return `${n} parts: ${checkParis(text)}`;
  }

  function checkCalls(r, choice) {
    const calls = r.steps[0].toolCalls;
    if (choice === 'auto') modelCheck(calls.length, `no call under auto, text ${JSON.stringify(r.steps[0].text)}`);
    need(calls.length, `no tool call under ${choice}: ${JSON.stringify(r.steps[0].text)}`);
    need(calls.length === 1, `${calls.length} calls for one question`);
    need(calls[0].toolName === 'get_weather', `called ${calls[0].toolName}`);
    need(!calls[0].invalid, `invalid call: ${calls[0].error?.message ?? JSON.stringify(calls[0].input)}`);
    checkCityArgs(calls[0].input);
  }

  // auto: the SDK's own tool loop (the call, its result, the answer) in one generateText.
  async function toolsAuto(base, model) {
    const r = await generateText({
      ...CALL, model: make(base, model), prompt: WEATHER_ASK, tools: TOOLS, toolChoice: 'auto', stopWhen: isStepCount(5),
    });
    checkCalls(r, 'auto');
    need(r.steps.length >= 2, `${r.steps.length} steps: no answer after the tool result`);
    return checkWeatherAnswer(r.text);
  }

  // required applies to every step of a loop: the forced call is one step, and the answer a
  // second generateText over the messages the first returned.
  async function toolsRequired(base, model) {
    const m = make(base, model);
    const messages = [{ role: 'user', content: WEATHER_ASK }];
    const r = await generateText({ ...CALL, model: m, messages, tools: TOOLS, toolChoice: 'required' });
    checkCalls(r, 'required');
    need(r.toolResults.length === 1, `${r.toolResults.length} tool results`);
    messages.push(...r.responseMessages); // the SDK's own messages (the call and its result)
    const a = await generateText({ ...CALL, model: m, messages, tools: TOOLS });
    return checkWeatherAnswer(a.text);
  }

  async function structured(base, model) {
    let r;
    try {
      r = await generateText({
        ...CALL, model: make(base, model), prompt: CITY_ASK, output: Output.object({ schema: City }),
      });
    } catch (e) {
      let json = null;
      try {
        json = NoObjectGeneratedError.isInstance(e) ? JSON.parse(e.text) : null;
      } catch {
        // not JSON: a FAIL below
      }
      modelCheck(schemaSent || !json, `JSON without the schema (json_object mode): ${e.text}`);
      throw e;
    }
    const p = r.output;
    need(p && typeof p === 'object', `output ${JSON.stringify(p)} from ${JSON.stringify(r.text)}`);
    return checkCity(p.name, p.country);
  }

  async function multiturn(base, model) {
    const m = make(base, model);
    const messages = [];
    let r;
    for (const turn of TURNS) {
      messages.push({ role: 'user', content: turn });
      r = await generateText({ ...CALL, model: m, messages });
      need(r.text, `empty reply to ${JSON.stringify(turn)}`);
      messages.push(...r.responseMessages); // the SDK's own messages, fed back
    }
    return checkGreen(r.text);
  }

  return { invoke, stream, tools_auto: toolsAuto, tools_required: toolsRequired, structured, multiturn };
}
