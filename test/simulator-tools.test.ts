/**
 * The simulator as a stand-in model for agents: which tool it calls, with which arguments, and how
 * it answers the tool's result. The tool sets and results below are cut from what Claude Code,
 * Codex CLI and Gemini CLI send.
 */
import t from 'tap';
import { calls, plan, units, type ChoicePlan, type EngineInput, type JsonSchema, type SimMessage, type SimTool } from '../plugins/upstreams/simulator/engine.js';
import { parseChatRequest } from '../plugins/upstreams/simulator/chat.js';
import { parseGeminiRequest } from '../plugins/upstreams/simulator/gemini.js';
import { parseMessagesRequest } from '../plugins/upstreams/simulator/messages.js';
import { parseResponsesRequest } from '../plugins/upstreams/simulator/responses.js';

const FILE = '/srv/scratch/notes.txt';
const READ_PROMPT = `Read the file ${FILE} and reply with its first line.`;

const user = (text: string): SimMessage => ({ role: 'user', text, images: 0 });

function input(prompt: string, tools: SimTool[], overrides: Partial<EngineInput> = {}): EngineInput {
  return { messages: [user(prompt)], tools, toolChoice: 'auto', responseFormat: 'text', n: 1, ...overrides };
}

/** The first call of a plan's first choice, its arguments parsed. */
function called(choice: ChoicePlan): { name: string; args: unknown } {
  if (choice.kind !== 'tool_call') throw new Error(`expected a tool call, got text: ${units(choice).join('')}`);
  const [call] = calls(choice);
  return { name: call.name, args: JSON.parse(call.argumentsJson) };
}

const callOf = (i: EngineInput) => called(plan(i).choices[0]);

const object = (properties: Record<string, JsonSchema>, required: string[]): JsonSchema => ({ type: 'object', properties, required, additionalProperties: false });
const str = { type: 'string' };

// Claude Code (default tool list, shortened): a sub-agent tool first, a deferred placeholder, Bash, Read.
const agentTool: SimTool = { name: 'Agent', parameters: object({ description: str, prompt: str, subagent_type: str }, ['description', 'prompt']) };
const placeholder: SimTool = { name: 'DeferredToolPlaceholder', parameters: object({}, []), deferred: true };
const bashTool: SimTool = { name: 'Bash', parameters: object({ command: str, timeout: { type: 'number' }, description: str }, ['command']) };
const readTool: SimTool = {
  name: 'Read',
  parameters: object(
    { file_path: str, offset: { type: 'integer', minimum: 0 }, limit: { type: 'integer', exclusiveMinimum: 0 }, pages: str },
    ['file_path'],
  ),
};
// Codex CLI: a shell tool whose command is a string, another whose command is an argv array, an image viewer.
const execCommand: SimTool = {
  name: 'exec_command',
  parameters: object({ cmd: str, workdir: str, login: { type: 'boolean' }, max_output_tokens: { type: 'number' }, tty: { type: 'boolean' } }, ['cmd']),
};
const argvShell: SimTool = { name: 'shell', parameters: object({ command: { type: 'array', items: str }, workdir: str, timeout_ms: { type: 'number' } }, ['command']) };
const viewImage: SimTool = { name: 'view_image', parameters: object({ path: str }, ['path']) };
// Gemini CLI: a topic tool first, then file tools and a shell.
const updateTopic: SimTool = { name: 'update_topic', parameters: object({ title: str, summary: str, strategic_intent: str }, ['strategic_intent']) };
const listDirectory: SimTool = { name: 'list_directory', parameters: object({ dir_path: str, ignore: { type: 'array', items: str } }, ['dir_path']) };
const readFile: SimTool = {
  name: 'read_file',
  parameters: object({ file_path: str, start_line: { type: 'integer', minimum: 1 }, end_line: { type: 'integer', minimum: 1 } }, ['file_path']),
};
const runShell: SimTool = { name: 'run_shell_command', parameters: object({ command: str, description: str, dir_path: str }, ['command']) };

t.test('tools marked defer_loading are never called: they have no schema until a tool search loads them', async (t) => {
  t.same(callOf(input('Say hello.', [placeholder, agentTool])).name, 'Agent', 'the engine skips a deferred tool');

  const messages = parseMessagesRequest(
    {
      model: 'sim-messages',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Say hello.' }],
      tools: [
        { name: 'DeferredToolPlaceholder', description: 'x', input_schema: { type: 'object', properties: {} }, defer_loading: true },
        { name: 'Read', input_schema: readTool.parameters },
      ],
    },
    {},
  );
  t.equal(callOf(messages.input).name, 'Read', 'Messages: a tool with defer_loading: true is skipped');

  const responses = parseResponsesRequest({
    model: 'sim-responses',
    input: 'Say hello.',
    tools: [
      { type: 'function', name: 'lookup_order', parameters: object({ id: str }, ['id']), defer_loading: true },
      { type: 'function', name: 'exec_command', parameters: execCommand.parameters },
    ],
  });
  t.equal(callOf(responses.input).name, 'exec_command', 'Responses: a function tool with defer_loading: true is skipped');

  t.equal(plan(input('Say hello.', [placeholder])).choices[0].kind, 'text', 'with only deferred tools, the answer is text');
  t.equal(callOf(input('Say hello.', [placeholder], { toolChoice: { name: placeholder.name } })).name, placeholder.name, 'a tool_choice naming it still wins');
});

t.test('a tool the prompt names is the one called', async (t) => {
  t.same(callOf(input(`Use Bash to show ${FILE}.`, [agentTool, readTool, bashTool])), { name: 'Bash', args: { command: `cat ${FILE}` } });
  t.same(callOf(input('Call view_image on ./shots/screen.png please', [execCommand, viewImage])), { name: 'view_image', args: { path: './shots/screen.png' } });
  t.equal(callOf(input('Use DeferredToolPlaceholder now.', [placeholder, agentTool])).name, 'Agent', 'a deferred tool is not called even when named');
});

t.test('a prompt asking to read a file calls a read-like tool with the path', async (t) => {
  t.same(callOf(input(READ_PROMPT, [agentTool, placeholder, bashTool, readTool])), { name: 'Read', args: { file_path: FILE } }, 'Claude Code: Read, optional arguments left out');
  t.same(callOf(input(READ_PROMPT.toLowerCase(), [agentTool, bashTool, readTool])).name, 'Read', 'the verb, not the tool name, asks for it');
  t.same(callOf(input(READ_PROMPT, [updateTopic, listDirectory, readFile, runShell])), { name: 'read_file', args: { file_path: FILE } }, 'Gemini CLI: read_file');
  t.same(
    callOf(input('Show me the contents of `src/app.ts`, please.', [updateTopic, readFile])),
    { name: 'read_file', args: { file_path: 'src/app.ts' } },
    'a relative path in backticks, trailing punctuation dropped',
  );
  t.equal(callOf(input(READ_PROMPT, [viewImage, readFile])).name, 'read_file', 'an image viewer is no file reader');
});

t.test('without a read-like tool, a shell tool runs cat PATH', async (t) => {
  t.same(callOf(input(READ_PROMPT, [viewImage, execCommand])), { name: 'exec_command', args: { cmd: `cat ${FILE}` } }, 'a string command');
  t.same(callOf(input(READ_PROMPT, [viewImage, argvShell])), { name: 'shell', args: { command: ['cat', FILE] } }, 'an argv array command');
  t.same(callOf(input(READ_PROMPT, [updateTopic, runShell])), { name: 'run_shell_command', args: { command: `cat ${FILE}` } });
  const slash: SimTool = { name: 'SlashCommand', parameters: object({ command: str }, ['command']) };
  t.same(callOf(input(READ_PROMPT, [slash, execCommand])).name, 'exec_command', 'a tool with a command argument is no shell unless its name says so');
});

t.test('the path comes from what the user wrote, not from context a harness adds', async (t) => {
  // Gemini CLI and Codex put their session context, full of paths, in tagged blocks of the user turn.
  const context = '<session_context>\nShowing up to 200 items (files + folders).\n/home/dev/.gemini/tmp/project/\n/home/dev/project/README.md\n</session_context>';
  t.same(callOf(input(`${context}\n${READ_PROMPT}`, [updateTopic, readFile])).args, { file_path: FILE });
  const reminder = '<system-reminder>\nRead /etc/motd before you open ~/.profile\n</system-reminder>';
  t.same(callOf(input(`${reminder}\n${READ_PROMPT}`, [agentTool, readTool])).args, { file_path: FILE });
  t.same(callOf(input(`Please open ~/notes/todo.md [[sim tokens=4]]`, [readTool])).args, { file_path: '~/notes/todo.md' });
  t.same(callOf(input('Show the notes, i.e. the file jquery.min.js, please.', [readTool])).args, { file_path: 'jquery.min.js' }, '"i.e." is no file name');
  t.same(callOf(input('Read https://example.com/page.html for me.', [agentTool, readTool])).name, 'Read', 'named, though a URL is no path');
  t.same(callOf(input('read https://example.com/page.html for me.', [agentTool, readTool])).name, 'Agent', 'a URL is no file to read: the first tool, as before');
});

t.test('required arguments get plausible values; optional ones are left out', async (t) => {
  const openFile: SimTool = {
    name: 'open_file',
    parameters: object(
      { path: str, mode: { type: 'string', enum: ['text', 'binary'] }, encoding: { type: 'string', default: 'utf-8' }, cwd: str, lines: { type: 'integer', minimum: 1 } },
      ['path', 'mode', 'encoding', 'cwd'],
    ),
  };
  t.same(callOf(input(`Open the file ${FILE}`, [openFile])).args, { path: FILE, mode: 'text', encoding: 'utf-8', cwd: '/srv/scratch' }, 'enum, default, and the directory of the path');
  t.same(callOf(input('Use update_topic to start.', [agentTool, updateTopic])).args, { strategic_intent: 'sample' }, 'a named tool without a path: its required arguments only');
});

t.test('when the prompt asks for nothing in particular, the first offered tool gets every property sampled, as before', async (t) => {
  t.same(callOf(input('Say hello in one sentence.', [agentTool, readTool])), { name: 'Agent', args: { description: 'sample', prompt: 'sample', subagent_type: 'sample' } });
  t.same(
    callOf(input(READ_PROMPT, [agentTool, readTool], { toolChoice: { name: 'Agent' } })).args,
    { description: 'sample', prompt: 'sample', subagent_type: 'sample' },
    'a tool the client forces is filled as before: the prompt did not choose it',
  );
  const structured = plan(input(READ_PROMPT, [], { toolChoice: 'none', responseFormat: { schema: readTool.parameters! } }));
  t.same(JSON.parse(units(structured.choices[0]).join('')), { file_path: 'sample', offset: 1, limit: 1, pages: 'sample' }, 'structured output samples every property');
});

t.test('families: each parser hands the engine what it needs to pick and fill', async (t) => {
  const chat = parseChatRequest({
    model: 'sim-chat',
    messages: [{ role: 'user', content: READ_PROMPT }],
    tools: [agentTool, bashTool, readTool].map((tool) => ({ type: 'function', function: { name: tool.name, parameters: tool.parameters } })),
  });
  t.same(callOf(chat.input), { name: 'Read', args: { file_path: FILE } }, 'Chat');
  const gemini = parseGeminiRequest(
    {
      contents: [{ role: 'user', parts: [{ text: '<session_context>\n/home/dev/project/\n</session_context>' }, { text: READ_PROMPT }] }],
      tools: [{ functionDeclarations: [updateTopic, readFile].map((tool) => ({ name: tool.name, parametersJsonSchema: tool.parameters })) }],
    },
    'sim-gemini',
  );
  t.same(callOf(gemini.input), { name: 'read_file', args: { file_path: FILE } }, 'Gemini');
  const responses = parseResponsesRequest({
    model: 'sim-responses',
    input: [
      { role: 'user', content: [{ type: 'input_text', text: '<environment_context>\n  <cwd>/home/dev/project</cwd>\n</environment_context>' }] },
      { role: 'user', content: [{ type: 'input_text', text: READ_PROMPT }] },
    ],
    tools: [viewImage, execCommand].map((tool) => ({ type: 'function', name: tool.name, parameters: tool.parameters })),
  });
  t.same(callOf(responses.input), { name: 'exec_command', args: { cmd: `cat ${FILE}` } }, 'Responses');
});

/** The text answer to a conversation whose last message is a tool result. */
function answerTo(result: string): string {
  const messages: SimMessage[] = [
    user(READ_PROMPT),
    { role: 'assistant', text: '', images: 0, toolCalls: [{ name: 'Read', argumentsJson: JSON.stringify({ file_path: FILE }) }] },
    { role: 'tool', text: result, images: 0 },
  ];
  return units(plan(input(READ_PROMPT, [readTool], { messages })).choices[0]).join('');
}

t.test("the answer to a tool result carries the file's first line intact", async (t) => {
  const first = 'Sluice e2e marker: heron-742 (do not edit)';
  t.match(answerTo(`${first}\nsecond line\n`), /^The tool returned: Sluice e2e marker: heron-742 \(do not edit\) second line\./, 'plain text');
  t.match(
    answerTo(`     1→${first}\n     2→second line\n     3→\n\n<system-reminder>\nWhenever you read a file, consider whether it is malware.\n</system-reminder>\n`),
    /^The tool returned: Sluice e2e marker: heron-742 \(do not edit\) second line\./,
    "Claude Code's Read: line numbers and the reminder it appends dropped",
  );
  t.match(answerTo(`1\t${first}\n2\tsecond line\n`), /^The tool returned: Sluice e2e marker: heron-742 \(do not edit\) second line\./, 'tab-numbered lines');
  t.match(
    answerTo(`Chunk ID: 9bf64b\nWall time: 0.0019 seconds\nProcess exited with code 0\nOriginal token count: 12\nOutput:\n${first}\nsecond line\n`),
    /^The tool returned: Sluice e2e marker: heron-742 \(do not edit\) second line\./,
    "Codex's command output: the header it wraps around the output dropped",
  );
  t.match(answerTo(`${first}  with  spaces\n`), /^The tool returned: Sluice e2e marker: heron-742 \(do not edit\) {2}with {2}spaces\./, 'spacing within a line is kept');
  t.match(
    answerTo(JSON.stringify({ output: `${first}\nsecond line\n` })),
    /^The tool returned: Sluice e2e marker: heron-742 \(do not edit\) second line\./,
    "Gemini CLI's result through Chat: the JSON object around the text dropped",
  );
  t.match(
    answerTo(JSON.stringify({ content: `     1→${first}\n     2→second line\n` })),
    /^The tool returned: Sluice e2e marker: heron-742 \(do not edit\) second line\./,
    "Claude Code's Read through Gemini: the JSON object and the line numbers dropped",
  );
  t.match(answerTo('{"temp": 21, "sky": "Sunny"}'), /^The tool returned: \{"temp": 21, "sky": "Sunny"\}\./, 'other JSON is content');
  t.match(answerTo('Output: 42\n'), /^The tool returned: Output: 42\./, 'a line starting with Output: is content');
  t.match(answerTo('<html>\n<body>hi</body>\n</html>'), /^The tool returned: <html> <body>hi<\/body> <\/html>\./, "a file's own markup is content");
});
