/**
 * The one place that imports uWebSockets.js. Its builds decide which Node versions Sluice runs on
 * (README, "Supported runtimes"): moving to another build starts here.
 */
import uWS from 'uWebSockets.js';

export type { HttpRequest, HttpResponse, TemplatedApp, WebSocket, us_listen_socket } from 'uWebSockets.js';
export default uWS;
