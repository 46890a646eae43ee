// Scaffolding shared by the JavaScript scenario files of the client matrix: the same protocol,
// prompts, checks and outcomes as common.py (read its docstring). Run as
// `node --import register.mjs FILE.mjs BASE_URL MODEL [SCENARIO...]` with $BERTH_CLIENT_NPM set.
import { readFileSync } from 'node:fs';

export const TIMEOUT_S = Number(process.env.BERTH_CLIENT_TIMEOUT || '120');
export const TIMEOUT_MS = TIMEOUT_S * 1000;

export const SCENARIOS = ['invoke', 'stream', 'tools_auto', 'tools_required', 'structured', 'multiturn'];

export const FRANCE = 'What is the capital of France? Answer in one word.';
export const WEATHER_ASK = 'What is the weather like in Paris right now? Use the get_weather tool.';
export const WEATHER_DESCRIPTION = 'Get the current weather of a city.';
export const WEATHER_RESULT = 'sunny, 22 degrees Celsius. Now answer the user in plain text.';
export const CITY_ASK = 'Give the capital of France as JSON with the keys "name" (the city) and "country".';
export const TURNS = [
  'Remember this: my favourite colour is green. Reply with one short sentence.',
  'What is the capital of France? Answer in one word.',
  'What is my favourite colour? Answer in one word.',
];
export const WEATHER_SCHEMA = {
  type: 'object',
  properties: { city: { type: 'string', description: 'The city, e.g. Paris' } },
  required: ['city'],
};

export class ModelAnswer extends Error {}
export class NotApplicable extends Error {}

export function modelCheck(cond, reason) {
  if (!cond) throw new ModelAnswer(reason);
}

export function need(cond, reason) {
  if (!cond) {
    const e = new Error(reason);
    e.name = 'Shape';
    throw e;
  }
}

export function short(x, n = 80) {
  const s = String(x).split(/\s+/).join(' ').trim();
  return s.length <= n ? s : `${s.slice(0, n - 3)}...`;
}

const q = (x) => JSON.stringify(x);

export function checkParis(text, what = 'answer') {
  need(typeof text === 'string' && text.trim(), `empty ${what}`);
  modelCheck(text.toLowerCase().includes('paris'), `${what} without Paris: ${q(short(text))}`);
  return short(text, 40);
}

export function checkCityArgs(args) {
  if (typeof args === 'string') {
    try {
      args = JSON.parse(args);
    } catch {
      need(false, `arguments are not JSON: ${q(args)}`);
    }
  }
  need(args && typeof args === 'object' && !Array.isArray(args), `arguments are not an object: ${q(args)}`);
  need(typeof args.city === 'string', `no string city in the arguments: ${q(args)}`);
  modelCheck(args.city.toLowerCase().includes('paris'), `get_weather called for ${q(args.city)}`);
  return args;
}

export function checkWeatherAnswer(text) {
  need(typeof text === 'string' && text.trim(), 'empty answer after the tool result');
  const low = text.toLowerCase();
  modelCheck(low.includes('22') || low.includes('sunny'), `answer ignores the tool result: ${q(short(text))}`);
  return short(text, 40);
}

export function checkCity(name, country) {
  need(typeof name === 'string' && typeof country === 'string', `not strings: ${q(name)} ${q(country)}`);
  modelCheck(name.toLowerCase().includes('paris'), `name ${q(name)}`);
  modelCheck(country.toLowerCase().includes('france'), `country ${q(country)}`);
  return `${name}, ${country}`;
}

export function checkGreen(text) {
  need(typeof text === 'string' && text.trim(), 'empty answer on the third turn');
  modelCheck(text.toLowerCase().includes('green'), `third turn forgot the colour: ${q(short(text))}`);
  return short(text, 40);
}

/** The installed version of an npm package (from its package.json in the npm folder). */
export function versionOf(pkg) {
  const file = `${process.env.BERTH_CLIENT_NPM}/node_modules/${pkg}/package.json`;
  return JSON.parse(readFileSync(file, 'utf8')).version;
}

function describe(e) {
  const name = e?.name || typeof e;
  const msg = String(e?.message ?? e);
  if (/timeout|abort/i.test(name) || /timed? ?out|aborted/i.test(msg)) {
    return `no answer in ${TIMEOUT_S} s (${name}): a hang`;
  }
  const cause = e?.cause ? ` (cause: ${short(e.cause?.message ?? e.cause, 100)})` : '';
  return name === 'Shape' ? short(msg, 200) : `${name}: ${short(msg + cause, 200)}`;
}

const emit = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);

/** Runs the named scenarios (all without names): {name: async (base, model) => note | "why n/a"}. */
export async function main(version, scenarios) {
  const [base, model, ...names] = process.argv.slice(2);
  const b = base.replace(/\/+$/, '');
  emit({ version });
  for (const name of names.length ? names : SCENARIOS) {
    const start = performance.now();
    let outcome;
    let reason;
    try {
      const fn = scenarios[name];
      if (fn === undefined) throw new NotApplicable('not a feature of this library');
      if (typeof fn === 'string') throw new NotApplicable(fn);
      reason = (await fn(b, model)) || '';
      outcome = 'PASS';
    } catch (e) {
      if (e instanceof NotApplicable) [outcome, reason] = ['N/A', e.message];
      else if (e instanceof ModelAnswer) [outcome, reason] = ['MODEL', e.message];
      else {
        [outcome, reason] = ['FAIL', describe(e)];
        console.error(e);
      }
    }
    emit({ scenario: name, outcome, reason: short(reason, 200), seconds: Math.round((performance.now() - start) / 100) / 10 });
  }
}
